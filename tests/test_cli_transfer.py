"""``zidane-actors copy`` and ``sessions import`` never lose nor alter data, on every target.

Each test runs the real CLI (``.venv/bin/zidane-actors``) as a subprocess
against real stores: a SQLite file, a file map directory (``file:DIR``), a
``zidane-actors serve`` process (over a SQLite file) and a fresh PostgreSQL
database. A write fails on purpose through a trigger in the target's own
database (SQLite or PostgreSQL): the store, the server and the CLI run
unchanged.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio
from _pg import fresh_database
from test_server_e2e import ServerProcess

from zidane_actors import _transfer as transfer
from zidane_actors.model import (
    RunOwner,
    Schedule,
    ScheduleFire,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    encode,
)
from zidane_actors.stores._url import open_store_url

CLI = str(Path(sys.executable).with_name("zidane-actors"))
KINDS = ("sqlite", "filemap", "remote", "postgres")
WITH_ARTIFACTS = ("sqlite", "remote", "postgres")  # a file map holds no artifacts
ELSEWHERE = RunOwner(host_id="elsewhere", pid=4242, token="their-token", started_at=5)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ZIDANE_ACTORS_")}


def za(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed ``zidane-actors``, run to its end."""
    return subprocess.run(
        [CLI, *argv], capture_output=True, text=True, timeout=300, env=_env(), check=False
    )


def reader_leaves_after_one_line(*argv: str) -> tuple[bytes, int, bytes]:
    """``zidane-actors ARGV | head -1``: the first line, the exit code and stderr."""
    proc = subprocess.Popen(
        [CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    return first, proc.wait(timeout=300), err


# -- data ---------------------------------------------------------------------------------


def turn(tid: str, text: str, at: int = 1) -> SessionTurn:
    return SessionTurn(id=tid, role="user", content=(TextBlock(text),), created_at=at)


def data(sid: str, turns: int = 1, updated_at: int = 1_700_000_000_000) -> SessionData:
    return SessionData(
        id=sid,
        created_at=1_600_000_000_000,
        updated_at=updated_at,
        status="completed",
        metadata={"title": f"session {sid}"},
        turns=tuple(turn(f"{sid}-t{n}", f"turn {n} of {sid}", n) for n in range(turns)),
    )


def artifact(sid: str, n: int) -> SessionArtifact:
    return SessionArtifact(
        id=f"{sid}-a{n}",
        session_id=sid,
        kind="link",
        uri=f"https://example.invalid/{sid}/{n}",
        label=f"link {n}",
        created_at=10 + n,
        updated_at=20 + n,
        meta={"n": n},
    )


def request(n: int) -> SendRequestRecord:
    return SendRequestRecord(
        request_id=f"req-{n}", fingerprint=f"fp{n}", created_at=30 + n, result={"n": n}
    )


@attrs.frozen
class Seed:
    """One session to put into a store, with what it holds."""

    data: SessionData
    artifacts: tuple[SessionArtifact, ...] = ()
    requests: tuple[SendRequestRecord, ...] = ()
    owner: RunOwner | None = None  # set: the session is stored running, held by it


async def put(url: str, *seeds: Seed) -> None:
    """Write ``seeds`` through the library (the way a running host stores them)."""
    async with open_store_url(url) as store:
        full: Any = store
        for seed in seeds:
            await store.save(seed.data)
            for a in seed.artifacts:
                await full.upsert_artifact(a)
            for r in seed.requests:
                await full.put_send_request(seed.data.id, r)
            if seed.owner is not None:
                await store.update_status(
                    seed.data.id, "running", owner=seed.owner, preserve_updated_at=True
                )


async def put_schedule(url: str, sid: str, *, fires: int, prompt: str = "digest") -> None:
    async with open_store_url(url) as store:
        full: Any = store
        await full.save_schedule(
            Schedule(
                id=sid,
                prompt=prompt,
                enabled=True,
                created_at=1,
                updated_at=2,
                interval_ms=86_400_000,
                next_fire_at=99,
            )
        )
        for n in range(fires):
            await full.record_schedule_fire(
                ScheduleFire(
                    id=f"{sid}-f{n}", schedule_id=sid, due_at=10 + n, fired_at=11 + n, status="ok"
                )
            )


async def schedules(url: str) -> bytes:
    async with open_store_url(url) as store:
        return encode(await transfer.schedules_of(store))


async def bundles(url: str) -> dict[str, bytes]:
    """Every session of a store as its exact bundle bytes (document, artifacts, send ids)."""
    async with open_store_url(url) as store:
        out: dict[str, bytes] = {}
        for sid in await store.list():
            found = await transfer.read_bundle(store, sid)
            assert found is not None
            out[sid] = found.encoded()
        return out


async def load(url: str, sid: str) -> SessionData:
    async with open_store_url(url) as store:
        found = await store.load(sid)
        assert found is not None
        return found


async def export_file(url: str, path: Path) -> Path:
    """The JSONL export of a store (what ``sessions export`` prints), written to ``path``."""
    async with open_store_url(url) as store:
        lines: list[str] = []
        async for _, _, bundle in transfer.iterate_bundles(store):
            lines.extend(transfer.bundle_lines(bundle))
    await trio.Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- targets ------------------------------------------------------------------------------


def _sqlite_fault(path: Path, session_id: str) -> None:
    """Make every artifact write of ``session_id`` fail, inside the SQLite file itself."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TRIGGER injected_fault BEFORE INSERT ON artifacts"
            f" WHEN NEW.session_id = '{session_id}'"
            " BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
        )
    conn.close()


def _postgres_fault(dsn: str, session_id: str) -> None:
    """Make every artifact write of ``session_id`` fail, inside the PostgreSQL database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION zidane.injected_fault() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN IF NEW.session_id = '{session_id}' THEN"
            " RAISE EXCEPTION 'injected fault'; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER injected_fault BEFORE INSERT ON zidane.artifacts"
            " FOR EACH ROW EXECUTE FUNCTION zidane.injected_fault()"
        )


@attrs.define
class Target:
    """A store of one kind that a copy or an import writes into."""

    kind: str
    url: str
    fault: Any  # (session id) -> None: that session's artifact writes fail from now on

    @property
    def holds_artifacts(self) -> bool:
        return self.kind in WITH_ARTIFACTS


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    with fresh_database("test_cli") as url:
        yield url


@pytest.fixture
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    kind: str = request.param
    if kind == "sqlite":
        path = tmp_path / "target.db"
        await put(f"sqlite:{path}")  # its schema, for the fault's trigger
        yield Target(kind, f"sqlite:{path}", lambda sid: _sqlite_fault(path, sid))
    elif kind == "filemap":
        yield Target(kind, f"file:{tmp_path / 'map'}", None)
    elif kind == "remote":
        path = tmp_path / "served.db"
        server = ServerProcess(f"sqlite:{path}")
        url = await trio.to_thread.run_sync(server.start)
        try:
            yield Target(kind, url, lambda sid: _sqlite_fault(path, sid))
        finally:
            await trio.to_thread.run_sync(server.stop)
    else:
        dsn = request.getfixturevalue("pg_database")
        async with open_store_url(dsn):  # its schema, for the fault's trigger
            pass
        yield Target(kind, dsn, lambda sid: _postgres_fault(dsn, sid))


def _targets(kinds: Sequence[str] = KINDS) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("target", kinds, indirect=True)


async def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(lambda: za(*argv))


# -- an id the target holds already -------------------------------------------------------


@_targets()
async def test_copy_refuses_a_session_the_target_holds_unless_replace(
    target: Target, tmp_path: Path
) -> None:
    """A copy onto a session id the target holds changed it silently (3 turns became 1)."""
    one = target.kind == "filemap"  # a file map holds one session
    held = [Seed(data("s1", turns=3), artifacts=(artifact("s1", 1),) if not one else ())]
    source = f"sqlite:{tmp_path / 'source.db'}"
    newer = [Seed(data("s1", turns=1, updated_at=1_700_000_500_000), requests=(request(1),))]
    if not one:  # the other ids: the target's kept, the source's not written either
        held.append(Seed(data("other", updated_at=1)))
        newer.append(Seed(data("s2")))
    await put(target.url, *held)
    await put(source, *newer)
    before = await bundles(target.url)

    done = await cli("copy", "--from", source, "--to", target.url)
    assert done.returncode == 1, done.stdout
    assert done.stderr == (
        "zidane-actors: error: session 's1' already exists in the target store (pass --replace)\n"
    )
    assert await bundles(target.url) == before  # nothing written, s2 neither

    # The same refusal as an import's: its words, its exit code.
    dump = await export_file(source, tmp_path / "source.jsonl")
    imported = await cli("sessions", "import", str(dump), "--store", target.url)
    assert imported.returncode == 1
    assert imported.stderr == (
        "zidane-actors: error: session 's1' already exists in the store (pass --replace)\n"
    )
    assert await bundles(target.url) == before

    replaced = await cli("copy", "--from", source, "--to", target.url, "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert "verified: every copied session reads back byte for byte" in replaced.stdout
    after, wanted = await bundles(target.url), await bundles(source)
    assert after["s1"] == wanted["s1"]  # replaced whole: its 3 turns and its artifact gone
    assert len((await load(target.url, "s1")).turns) == 1


# -- all or nothing -----------------------------------------------------------------------


async def test_copy_to_a_file_map_refuses_up_front_what_it_cannot_hold(tmp_path: Path) -> None:
    """A copy to a file map wrote one session, then failed: a file map holds one session."""
    source = f"sqlite:{tmp_path / 'source.db'}"
    await put(source, Seed(data("s1", updated_at=2)), Seed(data("s2", updated_at=1)))
    directory = tmp_path / "map"
    done = await cli("copy", "--from", source, "--to", f"file:{directory}")
    assert done.returncode == 1
    assert done.stderr.startswith("zidane-actors: error: the target store is a file map,")
    assert "one session per store" in done.stderr and "1 would be lost" in done.stderr
    assert done.stderr.count("\n") == 1
    assert not directory.exists() or not any(directory.iterdir())  # nothing written

    # One session holding an artifact: refused before it is written.
    lone = f"sqlite:{tmp_path / 'lone.db'}"
    await put(lone, Seed(data("s1"), artifacts=(artifact("s1", 1),)))
    done = await cli("copy", "--from", lone, "--to", f"file:{directory}")
    assert done.returncode == 1
    assert "cannot hold artifacts (upsert_artifact is missing): 1 would be lost" in done.stderr
    assert not directory.exists() or not any(directory.iterdir())

    # One session and a schedule (a file map has no schedules): refused before the session.
    scheduled = f"sqlite:{tmp_path / 'scheduled.db'}"
    await put(scheduled, Seed(data("s1")))
    await put_schedule(scheduled, "nightly", fires=1)
    done = await cli("copy", "--from", scheduled, "--to", f"file:{directory}")
    assert done.returncode == 1
    assert "cannot hold schedules (save_schedule is missing): 1 would be lost" in done.stderr
    assert not directory.exists() or not any(directory.iterdir())

    # A file map holding another session: refused, the map as it was.
    await put(f"file:{directory}", Seed(data("mine", turns=2)))
    before = await bundles(f"file:{directory}")
    plain = f"sqlite:{tmp_path / 'plain.db'}"
    await put(plain, Seed(data("s1", turns=2), requests=(request(1),)))
    done = await cli("copy", "--from", plain, "--to", f"file:{directory}")
    assert done.returncode == 1
    assert "holds session 'mine'; it cannot store 's1' (one session per store)" in done.stderr
    assert await bundles(f"file:{directory}") == before

    # What it can hold is copied and verified.
    fresh = f"file:{tmp_path / 'fresh'}"
    done = await cli("copy", "--from", plain, "--to", fresh)
    assert done.returncode == 0, done.stderr
    assert await bundles(fresh) == await bundles(plain)


@_targets(WITH_ARTIFACTS)
async def test_copy_writes_each_session_whole_or_not_at_all(target: Target, tmp_path: Path) -> None:
    """A session whose write fails half-way is removed again; the others are copied."""
    source = f"sqlite:{tmp_path / 'source.db'}"
    boom = Seed(
        data("boom", turns=3, updated_at=2),
        artifacts=(artifact("boom", 1), artifact("boom", 2)),
        requests=(request(1),),
    )
    await put(source, Seed(data("a", updated_at=3)), boom, Seed(data("c", updated_at=1)))
    target.fault("boom")  # the target refuses boom's artifacts (after its document is saved)
    wanted = await bundles(source)

    done = await cli("copy", "--from", source, "--to", target.url)
    assert await bundles(target.url) == {"a": wanted["a"], "c": wanted["c"]}  # no part of boom
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    assert lines[0] == "copied a (1 turns, 0 runs)"
    assert lines[1].startswith("not copied boom: ") and "injected fault" in lines[1], lines
    assert lines[1].endswith("(nothing of it written)")
    assert lines[2] == "copied c (1 turns, 0 runs)"
    assert lines[3] == f"copied 2 of 3 session(s) from {source} to {target.url}"
    assert "verified: every copied session reads back byte for byte (2)" in done.stdout
    error = done.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(
        "zidane-actors: error: 1 of 3 not copied (nothing of them written): boom: "
    ), done.stderr

    # Under --replace, a failed session leaves the target's own version as it was.
    previous = Seed(data("boom", turns=1, updated_at=9), requests=(request(7),))
    await put(target.url, previous)
    before = await bundles(target.url)
    done = await cli("copy", "--from", source, "--to", target.url, "--replace")
    assert done.returncode == 1
    assert "not copied boom: " in done.stdout
    assert await bundles(target.url) == {**before, "a": wanted["a"], "c": wanted["c"]}


async def test_a_write_that_cannot_be_undone_stops_the_copy_and_says_so(tmp_path: Path) -> None:
    source = f"sqlite:{tmp_path / 'source.db'}"
    boom = Seed(data("boom", updated_at=2), artifacts=(artifact("boom", 1),))
    await put(source, Seed(data("a", updated_at=3)), boom, Seed(data("c", updated_at=1)))
    path = tmp_path / "target.db"
    await put(f"sqlite:{path}")
    _sqlite_fault(path, "boom")
    with sqlite3.connect(path) as conn:  # and its removal fails too
        conn.execute(
            "CREATE TRIGGER injected_delete_fault BEFORE DELETE ON sessions"
            " WHEN OLD.id = 'boom' BEGIN SELECT RAISE(ABORT, 'injected delete fault'); END"
        )
    conn.close()
    done = await cli("copy", "--from", source, "--to", f"sqlite:{path}")
    assert done.returncode == 1
    assert done.stdout == "copied a (1 turns, 0 runs)\n"
    where = f"SQLite database {path}"
    assert done.stderr == (
        f"zidane-actors: error: session 'boom': {where}: injected fault; undoing the write"
        f" failed too ({where}: injected delete fault): the target may hold part of it;"
        " stopped there: nothing after it was copied\n"
    )


@_targets(("sqlite", "postgres"))
async def test_copy_refuses_a_schedule_the_target_holds_unless_replace(
    target: Target, tmp_path: Path
) -> None:
    source = f"sqlite:{tmp_path / 'source.db'}"
    await put(source, Seed(data("s1")))
    await put_schedule(source, "nightly", fires=2, prompt="new digest")
    await put_schedule(target.url, "nightly", fires=3, prompt="old digest")
    before = await schedules(target.url)
    done = await cli("copy", "--from", source, "--to", target.url)
    assert done.returncode == 1
    assert done.stderr == (
        "zidane-actors: error: schedule 'nightly' already exists in the target store"
        " (pass --replace)\n"
    )
    assert await schedules(target.url) == before and await bundles(target.url) == {}
    done = await cli("copy", "--from", source, "--to", target.url, "--replace")
    assert done.returncode == 0, done.stderr
    assert "copied schedule nightly (2 fires)" in done.stdout
    assert await schedules(target.url) == await schedules(source)  # its 3 old fires gone


async def test_import_writes_each_session_whole_or_not_at_all(tmp_path: Path) -> None:
    source = f"sqlite:{tmp_path / 'source.db'}"
    boom = Seed(data("boom", turns=2, updated_at=2), artifacts=(artifact("boom", 1),))
    await put(source, Seed(data("a", updated_at=3)), boom)
    dump = await export_file(source, tmp_path / "dump.jsonl")
    path = tmp_path / "target.db"
    await put(f"sqlite:{path}")
    _sqlite_fault(path, "boom")
    done = await cli("sessions", "import", str(dump), "--store", f"sqlite:{path}")
    assert list(await bundles(f"sqlite:{path}")) == ["a"]  # no part of boom
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "imported a (1 turns, 0 runs)"
    assert done.stdout.splitlines()[1].startswith("not imported boom: ")
    assert done.stderr.startswith("zidane-actors: error: 1 of 2 not imported"), done.stderr


# -- a running session keeps its owner ----------------------------------------------------


@_targets()
async def test_copy_and_import_keep_a_running_sessions_owner(
    target: Target, tmp_path: Path
) -> None:
    """A running session holding an artifact came out owned by the copying process."""
    source = f"sqlite:{tmp_path / 'source.db'}"
    live = Seed(
        data("live", turns=2),
        artifacts=(artifact("live", 1),) if target.holds_artifacts else (),
        requests=(request(1),),
        owner=ELSEWHERE,
    )
    await put(source, live)
    wanted = await bundles(source)
    stored = await load(source, "live")
    assert (stored.status, stored.run_owner) == ("running", ELSEWHERE)

    done = await cli("copy", "--from", source, "--to", target.url)
    assert done.returncode == 0, done.stderr
    copied = await load(target.url, "live")
    assert (copied.status, copied.run_owner) == ("running", ELSEWHERE)
    assert await bundles(target.url) == wanted

    dump = await export_file(source, tmp_path / "live.jsonl")
    done = await cli("sessions", "import", str(dump), "--store", target.url, "--replace")
    assert done.returncode == 0, done.stderr
    imported = await load(target.url, "live")
    assert (imported.status, imported.run_owner) == ("running", ELSEWHERE)
    assert await bundles(target.url) == wanted


# -- a reader that goes away --------------------------------------------------------------


def _long_id(n: int) -> str:
    """A 190-character session id: 500 report lines are far more than a pipe holds."""
    return f"{n:04d}-" + "x" * 185


def _orphans(sid: str, count: int) -> SessionData:
    """A session holding ``count`` tool results whose call is gone (each one a heal line)."""
    call = ToolCallBlock(id="c0", name="ls", input={})
    turns = [
        turn("u", "go"),
        SessionTurn(id="a", role="assistant", content=(call,), created_at=2),
        SessionTurn(
            id="r", role="user", content=(ToolResultBlock(call_id="c0", output="ok"),), created_at=3
        ),
    ]
    for n in range(count):
        result = ToolResultBlock(call_id=f"ghost{n}", output="?")
        turns.append(SessionTurn(id=_long_id(n), role="user", content=(result,), created_at=4 + n))
    return SessionData(id=sid, created_at=1, updated_at=2, turns=tuple(turns))


async def _many(tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    """A store of 500 sessions whose report lines are far more than a pipe holds."""
    source = f"sqlite:{tmp_path / 'source.db'}"
    await put(source, *(Seed(data(_long_id(n), updated_at=n + 1)) for n in range(500)))
    return source, await bundles(source)


async def test_an_import_finishes_when_its_reader_goes_away(tmp_path: Path) -> None:
    """``import … | head -1`` imported part of the file, still with exit code 0."""
    source, wanted = await _many(tmp_path)
    dump = await export_file(source, tmp_path / "many.jsonl")
    imported = f"sqlite:{tmp_path / 'imported.db'}"
    first, code, err = await trio.to_thread.run_sync(
        reader_leaves_after_one_line, "sessions", "import", str(dump), "--store", imported
    )
    assert first.startswith(b"imported 0499-")  # the most recent first
    assert (code, err) == (0, b"")
    assert await bundles(imported) == wanted  # every session, whole


async def test_a_copy_finishes_when_its_reader_goes_away(tmp_path: Path) -> None:
    source, wanted = await _many(tmp_path)
    copied = f"sqlite:{tmp_path / 'copied.db'}"
    first, code, err = await trio.to_thread.run_sync(
        reader_leaves_after_one_line, "copy", "--from", source, "--to", copied
    )
    assert first.startswith(b"copied 0499-")
    assert (code, err) == (0, b"")
    assert await bundles(copied) == wanted


async def test_heal_and_rm_finish_when_their_reader_goes_away(tmp_path: Path) -> None:
    # Both write before they report (heal in one mutate_history): a guard, they never broke.
    source = f"sqlite:{tmp_path / 'source.db'}"
    await put(source, Seed(_orphans("broken", 500)))
    first, code, err = await trio.to_thread.run_sync(
        reader_leaves_after_one_line, "sessions", "heal", "broken", "--store", source
    )
    assert first.startswith(b"dropped orphan-tool-result call ghost0 ")
    assert (code, err) == (0, b"")
    assert len((await load(source, "broken")).turns) == 3

    first, code, err = await trio.to_thread.run_sync(
        reader_leaves_after_one_line, "sessions", "rm", "broken", "--store", source
    )
    assert (first, code, err) == (b"deleted broken\n", 0, b"")
    assert "broken" not in await bundles(source)


async def test_a_write_that_fails_exits_non_zero_when_its_reader_went_away(
    tmp_path: Path,
) -> None:
    many = [Seed(data(_long_id(n), updated_at=n + 2)) for n in range(500)]
    boom = Seed(data("boom", updated_at=1), artifacts=(artifact("boom", 1),))
    source = f"sqlite:{tmp_path / 'source.db'}"
    await put(source, *many, boom)
    wanted = await bundles(source)
    dump = await export_file(source, tmp_path / "many.jsonl")  # boom is its last session
    path = tmp_path / "target.db"
    await put(f"sqlite:{path}")
    _sqlite_fault(path, "boom")

    first, code, err = await trio.to_thread.run_sync(
        reader_leaves_after_one_line, "sessions", "import", str(dump), "--store", f"sqlite:{path}"
    )
    assert first.startswith(b"imported 0499-")
    assert code == 1
    assert err.startswith(b"zidane-actors: error: 1 of 501 not imported"), err
    del wanted["boom"]
    assert await bundles(f"sqlite:{path}") == wanted
