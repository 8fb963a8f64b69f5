"""The file-map store: the shared contract, its file format, crash damage, one session only."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from store_contract import PROGRAMS, Reopen, StoreContract, StoreOpener, make_turn

from zidane_actors.errors import (
    ConflictError,
    CorruptDataError,
    CorruptDataWarning,
    InvalidNameError,
    SessionNotFoundError,
    StoreClosedError,
    ValidationError,
)
from zidane_actors.model import (
    SaveMetaOptions,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionSearch,
    SessionTurn,
    TextBlock,
    decode,
    encode_str,
)
from zidane_actors.stores import (
    DirectoryFileMapAdapter,
    FileMapStore,
    FileMapStoreOptions,
    SessionStore,
    create_file_map_store,
    open_directory_adapter,
    store_capabilities,
)

FILE_MAP_CAPABILITIES = frozenset(
    {
        "aclose",
        "claim_send_request",
        "demote_stale_run",
        "find_send_request",
        "generate_session_id",
        "generate_turn_id",
        "get_meta",
        "search_meta",
        "get_rev",
        "list_meta",
        "list_send_requests",
        "load_versioned",
        "mutate_history",
        "patch_meta",
        "put_send_request",
        "save_meta",
        "settle_send_request",
    }
)


class DictAdapter:
    """A host adapter keeping the map in memory (copies in and out, like real storage)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.saves = 0

    async def get(self) -> dict[str, str]:
        await trio.lowlevel.checkpoint()
        return dict(self.files)

    async def save(self, files: dict[str, str]) -> None:
        await trio.lowlevel.checkpoint()
        self.files = dict(files)
        self.saves += 1

    async def delete(self) -> None:
        await trio.lowlevel.checkpoint()
        self.files = {}


@asynccontextmanager
async def _closing(store: FileMapStore) -> AsyncIterator[SessionStore]:
    try:
        yield store
    finally:
        await store.aclose()


class _SingleSessionContract(StoreContract):
    """The contract for a store holding one session.

    The contract tests that need two sessions side by side are replaced by
    their one-session form (a second id is refused by design, see
    ``test_second_session_is_refused``); the reference-model property runs
    its programs on one session id.
    """

    required_capabilities = FILE_MAP_CAPABILITIES
    session_ids = ("s0",)
    forks_in_store = False
    # A delete removes every file: another store object on them starts rev afresh.
    rev_survives_reopen = False

    async def test_delete(self, store: SessionStore, reopen: Reopen) -> None:
        await store.save(session("s1", turns=(make_turn(1),)))
        await store.delete("never-existed")
        assert await store.list() == ["s1"]
        await store.delete("s1")
        store = await reopen()
        assert await store.load("s1") is None
        assert await store.get_turns("s1") == []
        assert await store.list() == []
        await store.save(session("s2"))  # an emptied store takes a new session
        assert await store.list() == ["s2"]

    async def test_list_newest_first_ties_by_id(self, store: SessionStore) -> None:
        await store.save(session("a"))
        assert await store.list() == ["a"]
        assert await store.list(SessionFilter(limit=1)) == ["a"]
        assert await store.list(SessionFilter(limit=0)) == []

    async def test_list_filters(self, store: SessionStore) -> None:
        await store.save(session("s1", project_root="/p1", agent_id="agent-a"))
        assert await store.list(SessionFilter()) == ["s1"]
        assert await store.list(SessionFilter(project_root="/p1")) == ["s1"]
        assert await store.list(SessionFilter(project_root=None)) == []
        assert await store.list(SessionFilter(agent_id="agent-a", project_root="/p1")) == ["s1"]
        assert await store.list(SessionFilter(agent_id="agent-b")) == []
        await store.save(session("s1", agent_id="agent-a"))
        assert await store.list(SessionFilter(project_root=None)) == ["s1"]
        assert await store.list(SessionFilter(project_root="/p1")) == []

    async def test_list_meta_matches_list_and_get_meta(self, store: SessionStore) -> None:
        full: Any = store
        await store.save(
            session("s1", turns=(make_turn(1), make_turn(2, "assistant")), agent_id="a")
        )
        for session_filter in (None, SessionFilter(agent_id="a"), SessionFilter(limit=0)):
            rows = await full.list_meta(session_filter)
            assert [r.id for r in rows] == await full.list(session_filter)
            for row in rows:
                assert row == await full.get_meta(row.id)
                assert (row.turn_count, row.user_message_count) == (2, 1)

    async def test_search_meta_words_filters_order_and_pages(self, store: SessionStore) -> None:
        full: Any = store
        turns = (self.search_turn(0, "hello there"), self.search_turn(1, "Deploy it", "run_sh"))
        await store.save(session("s1", turns=turns, agent_id="a", status="error"))
        await self.check_search(
            full,
            [
                SessionSearch(),
                SessionSearch(text="deploy run"),
                SessionSearch(text="deploy nowhere"),
                SessionSearch(agent_id="b"),
                SessionSearch(status="error", created_from=1, updated_to=10**9),
                SessionSearch(offset=1),
                SessionSearch(count_limit=0),
            ],
        )

    async def test_send_request_lifecycle(self, store: SessionStore, reopen: Reopen) -> None:
        full: Any = store
        await full.save(session("s1"))
        assert (await full.claim_send_request("s1", "req-1", "fp-1")).claimed
        again = await full.claim_send_request("s1", "req-1", "fp-other")
        assert not again.claimed and again.record is not None
        assert again.record.fingerprint == "fp-1"
        result = {"turnId": "t9", "text": "ünï", "n": [1, 2.5]}
        await full.settle_send_request("s1", "req-1", result)
        full = await reopen()
        settled = await full.find_send_request("s1", "req-1")
        assert settled is not None and settled.result == result
        await full.settle_send_request("s1", "req-1", None)
        assert await full.find_send_request("s1", "req-1") is None
        assert (await full.claim_send_request("s1", "req-1", "fp-3")).claimed

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    )
    @given(program=PROGRAMS)
    async def test_matches_reference_model(self, program: list[tuple[Any, ...]]) -> None:
        await self.check_reference_model(program)


class TestDirectoryFileMapContract(_SingleSessionContract):
    @asynccontextmanager
    async def open_storage(self) -> AsyncIterator[StoreOpener]:
        with tempfile.TemporaryDirectory() as tmp:
            yield lambda: _closing(create_file_map_store(DirectoryFileMapAdapter(tmp)))


class TestDictFileMapContract(_SingleSessionContract):
    @asynccontextmanager
    async def open_storage(self) -> AsyncIterator[StoreOpener]:
        adapter = DictAdapter()
        yield lambda: _closing(create_file_map_store(adapter))


def session(sid: str = "s", **kw: object) -> SessionData:
    return SessionData(id=sid, created_at=1, updated_at=2, **kw)  # type: ignore[arg-type]


def test_capabilities_are_declared() -> None:
    store = create_file_map_store(DictAdapter())
    assert store_capabilities(store) == FILE_MAP_CAPABILITIES


async def test_files_on_disk(tmp_path: Path) -> None:
    async with open_directory_adapter(tmp_path / "sess") as adapter:
        store = create_file_map_store(adapter)
        await store.save(session(turns=(make_turn(0),), metadata={"title": "hi"}))
        await store.append_turns("s", [make_turn(1, "assistant"), make_turn(2)])
    names = sorted(os.listdir(tmp_path / "sess"))
    # The manifest that commits each save, and no temporary files left behind.
    assert names == [".zidane-filemap.json", "meta.json", "turns.jsonl"]
    lines = (tmp_path / "sess" / "turns.jsonl").read_text().splitlines()
    assert [decode(line, SessionTurn).id for line in lines] == ["t0", "t1", "t2"]
    meta = (tmp_path / "sess" / "meta.json").read_text()
    assert '"title":"hi"' in meta and '"turns":[]' in meta  # turns live in turns.jsonl
    await store.claim_send_request("s", "q", "fp")
    assert "send-requests.json" in os.listdir(tmp_path / "sess")
    await store.delete("s")
    assert os.listdir(tmp_path / "sess") == [".zidane-filemap.lock"]  # held while open
    assert await store.load("s") is None
    await store.aclose()
    assert os.listdir(tmp_path / "sess") == []


async def test_custom_file_names(tmp_path: Path) -> None:
    options = FileMapStoreOptions(
        meta_file="m.json", turns_file="t.jsonl", send_requests_file="r.json"
    )
    store = create_file_map_store(DirectoryFileMapAdapter(tmp_path), options)
    await store.save(session(turns=(make_turn(0),)))
    await store.claim_send_request("s", "q", "fp")
    await store.aclose()
    assert sorted(os.listdir(tmp_path)) == [".zidane-filemap.json", "m.json", "r.json", "t.jsonl"]
    assert store.options == options


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x\n", "a\\b", "x" * 300])
def test_options_take_plain_file_names_only(name: str) -> None:
    with pytest.raises(InvalidNameError):
        FileMapStoreOptions(meta_file=name)


def test_options_need_distinct_names() -> None:
    with pytest.raises(InvalidNameError, match="distinct"):
        FileMapStoreOptions(meta_file="a", turns_file="a")


def test_adapter_is_checked() -> None:
    with pytest.raises(ValidationError, match="get/save/delete"):
        create_file_map_store(object())  # type: ignore[arg-type]


async def test_truncated_last_line_is_skipped_with_a_warning() -> None:
    adapter = DictAdapter()
    store = create_file_map_store(adapter)
    await store.save(session(turns=(make_turn(0), make_turn(1))))
    adapter.files["turns.jsonl"] += encode_str(make_turn(2))[:17]  # crash mid-append
    with pytest.warns(CorruptDataWarning, match="line 3 is truncated"):
        loaded = await store.load("s")
    assert loaded is not None and [t.id for t in loaded.turns] == ["t0", "t1"]
    # The next append replaces the torn tail instead of gluing onto it.
    with pytest.warns(CorruptDataWarning):
        await store.append_turns("s", [make_turn(3)])
    assert [t.id for t in await store.get_turns("s")] == ["t0", "t1", "t3"]


async def test_complete_last_line_without_newline_is_kept() -> None:
    adapter = DictAdapter()
    store = create_file_map_store(adapter)
    await store.save(session(turns=(make_turn(0),)))
    adapter.files["turns.jsonl"] += encode_str(make_turn(1))
    assert [t.id for t in await store.get_turns("s")] == ["t0", "t1"]


async def test_corrupt_middle_line_is_an_error_with_its_line_number() -> None:
    adapter = DictAdapter()
    store = create_file_map_store(adapter)
    await store.save(session(turns=(make_turn(0), make_turn(1), make_turn(2))))
    lines = adapter.files["turns.jsonl"].split("\n")
    lines[1] = '{"id": "t1", "role": "user", "content": [], "createdAt": "late"}'
    adapter.files["turns.jsonl"] = "\n".join(lines)
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl line 2"):
        await store.load("s")


async def test_corrupt_meta_is_an_error() -> None:
    adapter = DictAdapter()
    store = create_file_map_store(adapter)
    await store.save(session())
    adapter.files["meta.json"] = "{not json"
    with pytest.raises(CorruptDataError, match=r"meta\.json"):
        await store.get_meta("s")


async def test_second_session_is_refused() -> None:
    adapter = DictAdapter()
    store = create_file_map_store(adapter)
    await store.save(session("first"))
    with pytest.raises(ConflictError, match="holds session 'first'"):
        await store.save(session("second"))
    with pytest.raises(ConflictError):
        await store.save_meta(session("second"), SaveMetaOptions(meta_keys=("x",)))
    with pytest.raises(ConflictError):
        await store.claim_send_request("second", "q", "fp")
    with pytest.raises(SessionNotFoundError):
        await store.append_turns("second", [make_turn(0)])
    assert await store.load("second") is None
    assert await store.list() == ["first"]
    await store.delete("second")  # not ours: nothing happens
    assert await store.list() == ["first"]


async def test_mutate_history_rewrites_the_log() -> None:
    adapter = DictAdapter()
    store = create_file_map_store(adapter)
    await store.save(session(turns=tuple(make_turn(i) for i in range(3))))

    def drop_first(h: SessionHistory) -> SessionHistory:
        return SessionHistory(turns=h.turns[1:], runs=h.runs)

    assert await store.mutate_history("s", drop_first) == "ok"
    assert adapter.files["turns.jsonl"].count("\n") == 2
    assert [t.id for t in await store.get_turns("s")] == ["t1", "t2"]


def other_content(i: int) -> SessionTurn:
    return SessionTurn(id=f"t{i}", role="user", content=(TextBlock(text="other"),), created_at=1)


async def test_append_id_check_follows_every_writer_of_the_map() -> None:
    adapter = DictAdapter()
    store = create_file_map_store(adapter)
    other = create_file_map_store(adapter)  # another writer of the same map
    await store.save(session(turns=(make_turn(0),)))
    await store.append_turns("s", [make_turn(1)])
    await other.append_turns("s", [make_turn(2)])  # past what ``store`` indexed
    with pytest.raises(ConflictError, match="'t2'"):
        await store.append_turns("s", [other_content(2)])
    await store.append_turns("s", [make_turn(2), make_turn(3)])  # t2 a retry: only t3 is written
    assert [t.id for t in await store.get_turns("s")] == ["t0", "t1", "t2", "t3"]
    await other.save(session(turns=(make_turn(0),)))  # a rewrite drops t1..t3
    await store.append_turns("s", [other_content(1)])
    assert await store.get_turns("s") == [make_turn(0), other_content(1)]
    with pytest.raises(ConflictError, match="'t0'"):
        await store.append_turns("s", [other_content(0)])
    # Lines added by hand are parsed and located from where the index stopped.
    adapter.files["turns.jsonl"] += encode_str(make_turn(5)) + "\n" + "{torn\n"
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl line 4"):
        await store.append_turns("s", [make_turn(6)])


async def test_closed_store_refuses() -> None:
    store = create_file_map_store(DictAdapter())
    await store.aclose()
    with pytest.raises(StoreClosedError):
        await store.load("s")


async def test_directory_adapter_replaces_and_removes_files(tmp_path: Path) -> None:
    adapter = DirectoryFileMapAdapter(tmp_path / "d")
    assert await adapter.get() == {}  # absent directory: empty map
    await adapter.save({"a.txt": "one", "b.txt": "two ünï"})
    await adapter.save({"a.txt": "three"})
    assert await adapter.get() == {"a.txt": "three"}
    (tmp_path / "d" / ".a.txt.deadbeef.tmp").write_text("leftover of a crash")
    assert await adapter.get() == {"a.txt": "three"}
    with pytest.raises(InvalidNameError):
        await adapter.save({"../escape": "x"})
    assert not (tmp_path / "escape").exists()
    await adapter.delete()
    assert await adapter.get() == {}
    assert adapter.path == str(tmp_path / "d")
