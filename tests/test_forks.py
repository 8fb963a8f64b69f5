"""Forks and branches: the model's rule, the host and session API, every store against a reference.

The rule (``fork_document``, ``branch_history``, ``restored_history``) is
checked on hand-made histories; the API on the memory store and through the
portal doors; then random programs of appends, forks, branches, restores,
compactions and deletes run on every store (memory, SQLite, PostgreSQL,
remote, and the file map through its one-session form) against a small
reference model: every session's turns, runs, origin and branch list are the
reference's, in the store and in the memory of every handle. Two hosts
branching one session at once: one wins, the other is refused, nothing lost.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compaction import opened, pg_schema, place, server, two_hosts_at_once
from test_server import RequiredOnly, error_of, running, turn

from zidane_actors._transfer import JsonlReader, Writer, bundle_lines, read_bundle
from zidane_actors.actors import Session, SessionHost, open_session_host
from zidane_actors.errors import (
    ConflictError,
    SessionNotFoundError,
    UnsupportedOperationError,
    ValidationError,
)
from zidane_actors.model import (
    AppendTurnsOptions,
    Branch,
    SessionArtifactInput,
    SessionData,
    SessionHistory,
    SessionRun,
    SessionTurn,
    TextBlock,
    branch_history,
    fork_document,
    forked_from,
    restored_history,
)
from zidane_actors.portal import open_host_async, start_host
from zidane_actors.stores import (
    SessionStore,
    create_file_map_store,
    create_memory_store,
    fork_into,
    fork_session,
    list_forks,
    open_directory_adapter,
    open_memory_store,
    store_capabilities,
)

__all__ = ["pg_schema", "server"]  # the fixtures test_compaction defines, used here

BACKENDS = ("memory", "sqlite", "postgres", "remote")
"""Stores holding many sessions ("postgres" skipped where none answers; "remote": a server)."""


def t(turn_id: str, role: str = "user", run_id: str | None = None) -> SessionTurn:
    return SessionTurn(
        id=turn_id,
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(f"text of {turn_id}"),),
        created_at=1_000,
        run_id=run_id,
    )


def run(run_id: str) -> SessionRun:
    return SessionRun(id=run_id, prompt="p", started_at=1_000, status="completed")


def ids(values: Any) -> list[str]:
    return [v.id for v in values]


def source() -> SessionData:
    turns = (t("a", run_id="r1"), t("b", "assistant", "r1"), t("c", run_id="r2"), t("d"))
    return SessionData(
        id="s",
        created_at=1,
        updated_at=2,
        status="running",
        metadata={"title": "x", "zidaneBranches": [{"sessionId": "old"}], "branchOf": "y"},
        turns=turns,
        runs=(run("r0"), run("r1"), run("r2")),
        agent_id="coder",
    )


# -- the rule ---------------------------------------------------------------------------------


def test_a_fork_document_keeps_the_turns_through_at_and_their_runs() -> None:
    fork = fork_document(source(), new_id="f", at="b", created_at=9)
    assert ids(fork.turns) == ["a", "b"]
    assert ids(fork.runs) == ["r0", "r1"]  # r0 holds no turn: it stays; r2's turn is left
    assert (fork.status, fork.created_at, fork.updated_at, fork.agent_id) == (
        "idle",
        9,
        9,
        "coder",
    )
    assert fork.metadata == {
        "title": "x",
        "forkedFrom": {"sessionId": "s", "turnId": "b", "forkedAt": 9},
    }
    whole = fork_document(source(), new_id="f", at=None, created_at=9)
    assert whole.turns == source().turns and whole.runs == source().runs
    assert forked_from(whole) == forked_from(whole.metadata) is not None


def test_a_fork_at_no_turn_is_refused_located() -> None:
    with pytest.raises(ValidationError) as found:
        fork_document(source(), new_id="f", at="zz", created_at=9)
    assert found.value.path == "$.at"
    with pytest.raises(ValidationError) as bad:
        fork_document(source(), new_id="../f", at=None, created_at=9)
    assert bad.value.path == "$.id"


def test_branch_and_restore_histories() -> None:
    history = SessionHistory(source().turns, source().runs)
    cut = branch_history(history, "a")
    assert ids(cut.turns) == ["a"] and ids(cut.runs) == ["r0", "r1"]
    grown = SessionHistory((*cut.turns, t("e", run_id="r3")), (*cut.runs, run("r3")))
    back = restored_history(grown, history, "a")
    assert ids(back.turns) == ["a", "b", "c", "d"] and ids(back.runs) == ["r0", "r1", "r2"]
    with pytest.raises(ValidationError):
        restored_history(grown, history, "e")


# -- the API ----------------------------------------------------------------------------------


async def _seeded(host: SessionHost, sid: str = "s") -> Session:
    s = await host.create_session(id=sid, metadata={"title": "seed"})
    await s.append_turns([t("u0"), t("a1", "assistant")], AppendTurnsOptions(run=run("r1")))
    await s.append_turns(
        [t("u2", run_id="r2"), t("a3", "assistant", "r2")], AppendTurnsOptions(run=run("r2"))
    )
    return s


async def test_fork_session_on_the_host() -> None:
    async with open_memory_store() as store, open_session_host(store) as host:
        s = await _seeded(host)
        f = await host.fork_session("s", at="a1", id="f")
        assert ids(f.turns) == ["u0", "a1"] and ids(f.runs) == ["r1"]
        assert f.metadata["forkedFrom"]["sessionId"] == "s"
        generated = await host.fork_session("f")
        assert ids(generated.turns) == ["u0", "a1"] and generated.id != "f"
        await f.append_turns([t("x")])
        assert ids(s.turns) == ["u0", "a1", "u2", "a3"]
        await s.append_turns([t("y")])
        assert ids(f.turns) == ["u0", "a1", "x"]
        assert await list_forks(store, "s") == ["f"]
        assert await list_forks(store, "f") == [generated.id]
        await host.delete_session("s")
        again = await host.load_session("f")
        assert again is not None and ids(again.turns) == ["u0", "a1", "x"]
        with pytest.raises(SessionNotFoundError):
            await host.fork_session("s")
        with pytest.raises(ConflictError):
            await host.fork_session("f", id=generated.id)
        with pytest.raises(ValidationError):
            await host.fork_session("f", at="nope")


async def test_branch_and_restore_keep_every_turn() -> None:
    async with open_memory_store() as store, open_session_host(store) as host:
        s = await _seeded(host)
        left = await s.branch("a1")
        assert isinstance(left, Branch) and (left.turn_id, left.turns) == ("a1", 2)
        assert s.branches == (left,)
        assert ids(s.turns) == ["u0", "a1"] and ids(s.runs) == ["r1"]
        archive = await store.load(left.session_id)
        assert archive is not None and ids(archive.turns) == ["u0", "a1", "u2", "a3"]
        assert archive.metadata["branchOf"] == "s"
        assert "zidaneBranches" not in archive.metadata
        await s.append_turns([t("n4")])
        tail = await s.restore_branch(left.session_id)
        assert tail is not None and (tail.turn_id, tail.turns) == ("a1", 1)
        assert ids(s.turns) == ["u0", "a1", "u2", "a3"] and ids(s.runs) == ["r1", "r2"]
        assert list(s.branches) == [left, tail]
        rev = s.rev
        assert await s.restore_branch(left.session_id) is None  # held already: nothing written
        assert s.rev == rev and list(s.branches) == [left, tail]
        stored = await store.load("s")
        assert stored is not None and stored.turns == s.turns
        with pytest.raises(ValidationError) as bad:
            await s.branch("nope")
        assert bad.value.path == "$.at"
        with pytest.raises(ValidationError):
            await s.restore_branch("not-listed")
        await host.delete_session("s")
        assert await store.list() == []  # its archives went with it


async def test_a_listed_id_naming_another_session_is_never_deleted() -> None:
    async with open_memory_store() as store, open_session_host(store) as host:
        await host.create_session(id="other")
        entry = {"sessionId": "other", "turnId": "x", "createdAt": 1, "turns": 1}
        await host.create_session(id="s", metadata={"zidaneBranches": [entry]})
        await host.delete_session("s")
        assert await store.list() == ["other"]


def test_the_blocking_and_asyncio_doors_fork_and_branch() -> None:
    with start_host("memory:") as host:
        s = host.create_session(id="s")
        s.append_turns([t("a"), t("b")])
        f = host.fork_session("s", at="a", id="f")
        assert ids(f.turns) == ["a"]
        left = s.branch("a")
        assert s.branches == (left,) and ids(s.turns) == ["a"]
        assert s.restore_branch(left.session_id) is None and ids(s.turns) == ["a", "b"]

    async def main() -> None:
        async with open_host_async("memory:") as host:
            s = await host.create_session(id="s")
            await s.append_turns([t("a"), t("b")])
            f = await host.fork_session("s")
            assert ids(f.turns) == ["a", "b"]
            left = await s.branch("a")
            assert await s.restore_branch(left.session_id) is None

    asyncio.run(main())


async def test_a_fork_exports_whole_and_lands_in_a_file_map(tmp_path: Path) -> None:
    async with open_memory_store() as store, open_session_host(store) as host:
        await _seeded(host)
        await host.fork_session("s", at="u2", id="f")
        bundle = await read_bundle(store, "f")
        assert bundle is not None and ids(bundle.data.turns) == ["u0", "a1", "u2"]
        export = tmp_path / "export.jsonl"
        export.write_text("".join(f"{line}\n" for line in bundle_lines(bundle)), encoding="utf-8")
        reader = JsonlReader(str(export))
        reader.read()
        assert [b.data for b in reader.bundles] == [bundle.data]  # self-contained
        async with open_directory_adapter(tmp_path / "map") as adapter:
            target = create_file_map_store(adapter)
            try:
                writer = await Writer.open(target, replace=False, where="file map")
                await writer.put(reader.bundles[0])
                assert await target.load("f") == bundle.data
                # a file map holds one session: its forks go to other maps
                async with open_directory_adapter(tmp_path / "map2") as second:
                    other = create_file_map_store(second)
                    try:
                        await fork_into(target, other, "f", "g", at="a1", created_at=5)
                        g = await other.load("g")
                        assert g is not None and ids(g.turns) == ["u0", "a1"]
                        assert await list_forks(other, "f") == ["g"]
                    finally:
                        await other.aclose()
            finally:
                await target.aclose()


# -- every store against the reference --------------------------------------------------------


@attrs.define
class Reference:
    """What every session must hold: turn ids, their runs, origin and branch list."""

    turns: dict[str, list[str]] = attrs.field(factory=dict)
    run_of: dict[str, str | None] = attrs.field(factory=dict)
    origin: dict[str, tuple[str, str | None]] = attrs.field(factory=dict)
    branch_of: dict[str, str] = attrs.field(factory=dict)
    branches: dict[str, list[Branch]] = attrs.field(factory=dict)
    mains: list[str] = attrs.field(factory=list)
    """The sessions a program writes to (created and forked ones; archives are only read)."""

    def runs(self, session_id: str) -> list[str]:
        """A session's run ids: every run here has turns, in the order they first show."""
        found: list[str] = []
        for turn_id in self.turns[session_id]:
            run_id = self.run_of[turn_id]
            if run_id is not None and run_id not in found:
                found.append(run_id)
        return found

    def fork(self, source_id: str, new_id: str, at: str | None) -> None:
        turns = self.turns[source_id]
        kept = turns if at is None else turns[: turns.index(at) + 1]
        self.turns[new_id] = list(kept)
        self.origin[new_id] = (source_id, kept[-1] if kept else None)
        self.branches[new_id] = []

    def archive(self, session_id: str, entry: Branch) -> None:
        self.fork(session_id, entry.session_id, None)
        self.branch_of[entry.session_id] = session_id
        self.branches[session_id].append(entry)

    def delete(self, session_id: str) -> None:
        gone = [session_id] + [
            b.session_id
            for b in self.branches[session_id]
            if self.branch_of.get(b.session_id) == session_id
        ]
        for sid in gone:
            for table in (self.turns, self.origin, self.branch_of, self.branches):
                table.pop(sid, None)
        self.mains.remove(session_id)


Op = tuple[str, int, int]

fork_ops = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 9), st.integers(1, 2)),
    st.tuples(st.just("fork"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("branch"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("restore"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("compact"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, 9), st.just(0)),
    st.tuples(st.just("reload"), st.just(0), st.just(0)),
)
fork_programs = st.lists(fork_ops, min_size=1, max_size=10)


async def check_all(
    host: SessionHost, store: SessionStore, ref: Reference, handles: dict[str, Session], when: str
) -> None:
    assert sorted(await store.list()) == sorted(ref.turns), f"{when}: the sessions differ"
    for sid in ref.turns:
        stored = await store.load(sid)
        assert stored is not None, f"{when}: {sid} lost"
        assert ids(stored.turns) == ref.turns[sid], f"{when}: the turns of {sid}"
        assert ids(stored.runs) == ref.runs(sid), f"{when}: the runs of {sid}"
        origin = forked_from(stored)
        found = None if origin is None else (origin.session_id, origin.turn_id)
        assert found == ref.origin.get(sid), f"{when}: the origin of {sid}"
        assert stored.metadata.get("branchOf") == ref.branch_of.get(sid), when
        held = handles.get(sid) or await host.load_session(sid)
        assert held is not None
        assert held.turns == stored.turns, f"{when}: the memory of {sid} is not its store"
        assert held.runs == stored.runs, f"{when}: the memory of {sid} is not its store"
        assert list(held.branches) == ref.branches[sid], f"{when}: the branches of {sid}"
        assert await store.get_turns(sid, 1, 2) == list(stored.turns[1:3]), when
        if "get_meta" in store_capabilities(store):
            row = await cast(Any, store).get_meta(sid)
            assert (row.turn_count, row.run_count) == (len(stored.turns), len(stored.runs)), when
    sources = {source for source, _ in ref.origin.values()}
    for source_id in sources:
        expected = sorted(sid for sid, (src, _) in ref.origin.items() if src == source_id)
        assert await list_forks(store, source_id) == expected, f"{when}: forks of {source_id}"


async def run_fork_program(
    backend: str, program: list[Op], where: Path, schema: str | None
) -> None:
    tag = uuid.uuid4().hex[:8]
    ref = Reference()
    async with opened(backend, where, schema) as store:
        for existing in await store.list():  # a shared server or schema: start empty
            await store.delete(existing)
        async with open_session_host(store) as host:
            handles: dict[str, Session] = {}

            async def create() -> None:
                sid = f"m-{tag}-{len(ref.mains)}-{len(ref.turns)}"
                handles[sid] = await host.create_session(id=sid)
                ref.turns[sid], ref.branches[sid] = [], []
                ref.mains.append(sid)

            await create()
            for step, (kind, a, b) in enumerate(program):
                when = f"step {step} {kind}({a}, {b})"
                if not ref.mains:
                    await create()
                sid = ref.mains[a % len(ref.mains)]
                s = handles[sid]
                turns = ref.turns[sid]
                pick = turns[b % len(turns)] if turns else "none"
                if kind == "append":
                    made = [f"{tag}.{step}.{k}" for k in range(b)]
                    run_id = f"r{step}"
                    await s.append_turns(
                        [t(i, run_id=run_id) for i in made], AppendTurnsOptions(run=run(run_id))
                    )
                    ref.run_of.update(dict.fromkeys(made, run_id))
                    turns.extend(made)
                elif kind == "fork":
                    at = None if b % (len(turns) + 1) == len(turns) else pick
                    f = await host.fork_session(sid, at=at)
                    handles[f.id] = f
                    ref.fork(sid, f.id, at)
                    ref.mains.append(f.id)
                elif kind == "branch":
                    if not turns:
                        with pytest.raises(ValidationError):
                            await s.branch("none")
                        continue
                    entry = await s.branch(pick)
                    k = turns.index(pick) + 1
                    assert (entry.turn_id, entry.turns) == (pick, len(turns) - k), when
                    ref.archive(sid, entry)
                    del turns[k:]
                elif kind == "restore":
                    listed = ref.branches[sid]
                    if not listed:
                        continue
                    chosen = listed[b % len(listed)]
                    at = chosen.turn_id
                    back = ref.turns[chosen.session_id]
                    if at not in turns:
                        with pytest.raises(ValidationError):
                            await s.restore_branch(chosen.session_id)
                        continue
                    k = turns.index(at) + 1
                    head, left = turns[:k], turns[k:]
                    tail = await s.restore_branch(chosen.session_id)
                    if [*head, *back[back.index(at) + 1 :]] == turns:  # held already
                        assert tail is None, when
                        continue
                    if left:
                        assert tail is not None and (tail.turn_id, tail.turns) == (at, len(left))
                        ref.archive(sid, tail)  # the head as it was before the restore
                    else:
                        assert tail is None, when
                    ref.turns[sid] = [*head, *back[back.index(at) + 1 :]]
                elif kind == "compact":
                    if not turns:
                        continue
                    marker = await s.compact([t(f"{tag}.{step}.sum")], through=pick)
                    ref.run_of[marker.id] = None
                    turns.append(marker.id)
                elif kind == "delete":
                    await host.delete_session(sid)
                    handles.pop(sid)
                    ref.delete(sid)
                else:
                    async with open_session_host(store) as other:
                        await check_all(other, store, ref, {}, f"{when}, by another host")
                await check_all(host, store, ref, handles, when)
        async with open_session_host(store) as other:
            await check_all(other, store, ref, {}, "after a reload by another host")


_EXAMPLES = {"memory": 40, "sqlite": 20, "postgres": 10, "remote": 10}


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_programs_of_forks_and_branches_match_the_reference(
    backend: str, request: pytest.FixtureRequest
) -> None:
    schema = place(backend, request)

    @settings(max_examples=_EXAMPLES[backend])
    @given(program=fork_programs)
    def examples(program: list[Op]) -> None:
        with tempfile.TemporaryDirectory() as where:
            trio.run(run_fork_program, backend, program, Path(where), schema)

    examples()


# -- two writers ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_two_hosts_branching_at_once_one_wins_nothing_lost(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def branch(name: str, s: Session, at: str) -> Branch:
        return await s.branch(at)

    at = {"a": "u0", "b": "u2"}
    async with two_hosts_at_once(backend, tmp_path, place(backend, request), branch, at) as race:
        store_a, sid, loser = race.store_a, race.sid, race.loser
        entry = race.outcome
        assert isinstance(entry, Branch)
        stored = await store_a.load(sid)
        assert stored is not None
        assert ids(stored.turns) == ["u0", "a1", "u2", "a3"][: 1 if race.won == "a" else 3]
        archive = await store_a.load(entry.session_id)
        assert archive is not None and ids(archive.turns) == ["u0", "a1", "u2", "a3"]
        # Only the winner's archive is stored and listed: the loser's was removed.
        assert await list_forks(store_a, sid) == [entry.session_id]
        assert loser.turns == stored.turns and list(loser.branches) == [entry]
        # The loser goes on from what it sees now.
        again = await loser.branch("u0")
        assert ids(loser.turns) == ["u0"] and list(loser.branches) == [entry, again]


# -- the REST routes --------------------------------------------------------------------------


@pytest.mark.parametrize("backing", ["memory", "required-only"])
async def test_the_fork_routes(backing: str) -> None:
    store = create_memory_store() if backing == "memory" else RequiredOnly()
    async with running(store) as c:
        session = {"id": "s1", "createdAt": 1, "updatedAt": 1, "metadata": {"title": "x"}}
        assert (await c.put("/sessions/s1", json=session)).status_code == 204
        await c.post("/sessions/s1/turns", json={"turns": [turn(1), turn(2)]})
        r = await c.post("/sessions/s1/forks", json={"at": "t1", "id": "f1", "createdAt": 5})
        assert r.status_code == 201 and r.json() == {"id": "f1"}
        fork = (await c.get("/sessions/f1")).json()
        assert [x["id"] for x in fork["turns"]] == ["t1"]
        assert fork["metadata"] == {
            "title": "x",
            "forkedFrom": {"sessionId": "s1", "turnId": "t1", "forkedAt": 5},
        }
        made = await c.post("/sessions/s1/forks", json={})
        assert made.status_code == 201
        assert (await c.get("/sessions/s1/forks")).json() == {
            "ids": sorted(["f1", made.json()["id"]])
        }
        for body, status, code in (
            ({"at": "nope"}, 422, "invalid"),
            ({"id": "f1"}, 409, "conflict"),
            ({"id": "../x"}, 400, "invalid_name"),
            ({"at": 7}, 422, "invalid_body"),
            ({"surprise": 1}, 422, "invalid_body"),
        ):
            r = await c.post("/sessions/s1/forks", json=body)
            assert (r.status_code, error_of(r)["code"]) == (status, code), body
        r = await c.post("/sessions/ghost/forks", json={})
        assert (r.status_code, error_of(r)["code"]) == (404, "session_not_found")
        r = await c.post("/sessions/s1/forks", json={"expectedRev": 999})
        expected = (409, "stale_session") if backing == "memory" else (501, "unsupported")
        assert (r.status_code, error_of(r)["code"]) == expected
        paths = (await c.get("/openapi.json")).json()["paths"]
        assert {"post", "get"} <= set(paths["/sessions/{sessionId}/forks"])


# -- the file map: one session per store, its forks in other maps ------------------------------


map_ops = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 9), st.integers(1, 2)),
    st.tuples(st.just("fork"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("compact"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, 9), st.just(0)),
)


async def run_file_map_program(program: list[Op], where: Path) -> None:
    """Each session in its own file map (a directory), each map with its own host."""
    ref = Reference()
    async with AsyncExitStack() as stack:
        stores: dict[str, SessionStore] = {}
        handles: dict[str, Session] = {}

        async def open_map(sid: str) -> SessionHost:
            adapter = await stack.enter_async_context(open_directory_adapter(where / sid))
            store = create_file_map_store(adapter)
            stack.push_async_callback(store.aclose)
            stores[sid] = store
            return await stack.enter_async_context(open_session_host(store))

        hosts = {"m0": await open_map("m0")}
        handles["m0"] = await hosts["m0"].create_session(id="m0")
        ref.turns["m0"], ref.branches["m0"] = [], []
        ref.mains.append("m0")
        for step, (kind, a, b) in enumerate(program):
            when = f"step {step} {kind}({a}, {b})"
            if not ref.mains:
                break
            sid = ref.mains[a % len(ref.mains)]
            turns = ref.turns[sid]
            pick = turns[b % len(turns)] if turns else None
            if kind == "append":
                made = [f"{step}.{k}" for k in range(b)]
                await handles[sid].append_turns(
                    [t(i, run_id=f"r{step}") for i in made],
                    AppendTurnsOptions(run=run(f"r{step}")),
                )
                ref.run_of.update(dict.fromkeys(made, f"r{step}"))
                turns.extend(made)
            elif kind == "fork":
                new = f"f{step}"
                at = None if b % (len(turns) + 1) == len(turns) else pick
                hosts[new] = await open_map(new)
                await fork_into(stores[sid], stores[new], sid, new, at=at, created_at=7)
                loaded = await hosts[new].load_session(new)
                assert loaded is not None
                handles[new] = loaded
                ref.fork(sid, new, at)
                ref.mains.append(new)
            elif kind == "compact" and pick is not None:
                marker = await handles[sid].compact([t(f"{step}.sum")], through=pick)
                ref.run_of[marker.id] = None
                turns.append(marker.id)
            elif kind == "delete":
                await hosts[sid].delete_session(sid)
                handles.pop(sid)
                ref.delete(sid)
            for live in ref.turns:
                stored = await stores[live].load(live)
                assert stored is not None, f"{when}: {live} lost"
                assert ids(stored.turns) == ref.turns[live], f"{when}: the turns of {live}"
                assert ids(stored.runs) == ref.runs(live), f"{when}: the runs of {live}"
                assert handles[live].turns == stored.turns, f"{when}: memory of {live}"
                origin = forked_from(stored)
                found = None if origin is None else (origin.session_id, origin.turn_id)
                assert found == ref.origin.get(live), when


def test_random_programs_of_forks_across_file_maps_match_the_reference() -> None:
    @settings(max_examples=15)
    @given(program=st.lists(map_ops, min_size=1, max_size=8))
    def examples(program: list[Op]) -> None:
        with tempfile.TemporaryDirectory() as where:
            trio.run(run_file_map_program, program, Path(where))

    examples()


async def test_a_store_of_the_required_methods_only_forks_and_branches() -> None:
    """No versions, no patch_meta, no get_meta: the generic paths (nothing conditional)."""
    store = RequiredOnly()
    async with open_session_host(store) as host:
        s = await _seeded(host)
        assert s.rev is None
        f = await host.fork_session("s", at="u0", id="f")
        assert ids(f.turns) == ["u0"]
        left = await s.branch("a1")
        assert ids(s.turns) == ["u0", "a1"] and s.branches == (left,)
        archive = await store.load(left.session_id)
        assert archive is not None and archive.metadata["branchOf"] == "s"
        assert await s.restore_branch(left.session_id) is None
        assert ids(s.turns) == ["u0", "a1", "u2", "a3"]
        assert await list_forks(store, "s") == sorted(["f", left.session_id])
        await host.delete_session("s")
        assert sorted(await store.list()) == ["f"]
        with pytest.raises(UnsupportedOperationError):
            await fork_session(store, "f", "g", at=None, created_at=1, expected_rev=1)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_artifact_then_a_branch_and_a_compaction(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An artifact's upsert moves the rev by a step its answer does not say: not another writer.
    A branch's save keeps the session's artifacts and send-request ids."""
    where = place(backend, request)
    async with opened(backend, tmp_path, where) as store, open_session_host(store) as host:
        s = await _seeded(host, f"s-{uuid.uuid4().hex[:10]}")
        made = await s.add_artifact(SessionArtifactInput(kind="pr", uri="https://x/1", label="pr"))
        assert made is not None
        entry = await s.branch("a1")
        marker = await s.compact([], through="u0")
        assert ids(s.turns) == ["u0", "a1", marker.id] and s.branches == (entry,)
        assert await s.list_artifacts() == (made,)
        await host.delete_session(s.id)
        assert await store.load(entry.session_id) is None


async def test_a_fork_sees_the_writes_queued_before_it() -> None:
    async with open_memory_store() as store, open_session_host(store) as host:
        s = await _seeded(host)
        first = s.set_agent_id_nowait("coder")  # queued in the session's actor: so are the rest
        replies = [first, *(s.append_turns_nowait([t(f"q{i}")]) for i in range(3))]
        f = await host.fork_session("s")
        assert ids(f.turns)[-3:] == ["q0", "q1", "q2"]
        for reply in replies:
            await reply.wait()
