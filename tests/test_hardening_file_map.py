"""The file-map store on real files: links, private modes, torn tails, foreign files, crashes.

Each test plants on disk what an attacker, an editor, a crash or another
tool leaves in a session directory, then drives the store through it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import signal
import stat
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _file_map_worker as worker
import pytest
import trio
from test_server_e2e import ServerProcess

from zidane_actors.errors import (
    ConflictError,
    CorruptDataError,
    CorruptDataWarning,
    ExternalChangeWarning,
    InvalidNameError,
    StoreLockedError,
    StoreReadOnlyError,
    ValidationError,
)
from zidane_actors.model import SessionData, SessionTurn, TextBlock, encode_str
from zidane_actors.stores import (
    DirectoryFileMapAdapter,
    FileMapStore,
    FileMapStoreOptions,
    create_file_map_store,
    open_directory_adapter,
    open_memory_store,
)

MANIFEST = ".zidane-filemap.json"
LOCK = ".zidane-filemap.lock"
WORKER = str(Path(__file__).with_name("_file_map_worker.py"))


def turn(i: int, text: str = "ünï €uro 𝄞") -> SessionTurn:
    return SessionTurn(
        id=f"t{i}", role="user", content=(TextBlock(text=f"{text} {i}"),), created_at=1_000 + i
    )


def session(*turns: SessionTurn) -> SessionData:
    return SessionData(id="s", created_at=1, updated_at=2, turns=turns)


def store_on(directory: Path) -> FileMapStore:
    return create_file_map_store(DirectoryFileMapAdapter(directory))


async def reopen(store: FileMapStore, directory: Path) -> FileMapStore:
    """Close ``store`` (its directory's lock goes) and open the directory again."""
    await store.aclose()
    return store_on(directory)


async def ids(store: FileMapStore) -> list[str]:
    return [t.id for t in await store.get_turns("s")]


async def ids_in(directory: Path) -> list[str]:
    """The turn ids a fresh store on ``directory`` reads (closed afterwards)."""
    store = store_on(directory)
    try:
        return await ids(store)
    finally:
        await store.aclose()


async def saved(directory: Path, *turns: SessionTurn, manifest: bool = True) -> FileMapStore:
    """A store on ``directory`` holding ``turns``; without the manifest the files are as
    a hand edit or an older version left them (read as they are)."""
    store = store_on(directory)
    await store.save(session(*turns))
    if not manifest:
        (directory / MANIFEST).unlink(missing_ok=True)
        store = await reopen(store, directory)
    return store


def entries(directory: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry of ``directory``: its type and its bytes (or link target)."""
    found: dict[str, tuple[int, bytes]] = {}
    for name in os.listdir(directory):
        path = directory / name
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            found[name] = (stat.S_IFLNK, os.fsencode(os.readlink(path)))
        elif stat.S_ISREG(mode):
            found[name] = (stat.S_IFREG, path.read_bytes())
        else:
            found[name] = (stat.S_IFMT(mode), b"")
    return found


# -- item 7: links and other non-regular files are refused, never followed ------------------


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text("SECRET-KEY-42\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("manifest", [True, False], ids=["committed", "hand-made"])
@pytest.mark.parametrize("name", ["meta.json", "turns.jsonl", "send-requests.json"])
async def test_planted_link_is_refused_and_its_target_never_copied(
    tmp_path: Path, secret: Path, name: str, manifest: bool
) -> None:
    directory = tmp_path / "sess"
    store = await saved(directory, turn(0), manifest=manifest)
    await store.claim_send_request("s", "q", "fp")
    store = await reopen(store, directory)
    (directory / name).unlink()
    (directory / name).symlink_to(secret)
    with pytest.raises(CorruptDataError, match=rf"{name} is a symbolic link"):
        await store.load("s")
    with pytest.raises(CorruptDataError, match=rf"{name} is a symbolic link"):
        await store.append_turns("s", [turn(1)])
    with pytest.raises(CorruptDataError, match=rf"{name} is a symbolic link"):
        await store.save(session(turn(2)))
    assert os.readlink(directory / name) == str(secret)  # still a link, not replaced
    for entry, (_, content) in entries(directory).items():
        assert entry == name or b"SECRET" not in content
    assert entries(secret.parent)[secret.name] == (stat.S_IFREG, b"SECRET-KEY-42\n")


async def test_link_to_proc_environ_is_not_read(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    store = await saved(directory, turn(0), manifest=False)
    (directory / "turns.jsonl").unlink()
    (directory / "turns.jsonl").symlink_to("/proc/self/environ")
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl is a symbolic link"):
        await store.get_turns("s")
    assert all(b"PATH=" not in content for _, content in entries(directory).values())


async def test_planted_pipe_and_directory_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    store = await saved(directory, turn(0))
    (directory / "turns.jsonl").unlink()
    os.mkfifo(directory / "turns.jsonl")  # would block a reader forever
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl is a named pipe"):
        await store.load("s")
    (directory / "turns.jsonl").unlink()
    (directory / "turns.jsonl").mkdir()
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl is a directory"):
        await store.load("s")


async def test_files_are_private(tmp_path: Path) -> None:
    async with open_directory_adapter(tmp_path / "made") as adapter:
        store = create_file_map_store(adapter)
        await store.save(session(turn(0)))
        await store.append_turns("s", [turn(1)])
        await store.claim_send_request("s", "q", "fp")
    assert stat.S_IMODE(os.stat(tmp_path / "made").st_mode) == 0o700
    names = os.listdir(tmp_path / "made")
    assert sorted(names) == [MANIFEST, "meta.json", "send-requests.json", "turns.jsonl"]
    for name in names:
        assert stat.S_IMODE(os.stat(tmp_path / "made" / name).st_mode) == 0o600, name
    await store_on(tmp_path / "by-save").save(session())
    assert stat.S_IMODE(os.stat(tmp_path / "by-save").st_mode) == 0o700


# -- item 8: a complete last line without its newline is a turn ------------------------------


@pytest.mark.parametrize("manifest", [True, False], ids=["committed", "hand-made"])
async def test_last_line_without_newline_is_kept_by_the_next_append(
    tmp_path: Path, manifest: bool
) -> None:
    directory = tmp_path / "sess"
    store = await saved(directory, turn(0), turn(1), manifest=False)
    path = directory / "turns.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    if manifest:  # the store committed the file as it is now
        await store.patch_meta("s", {"k": 1})
        store = await reopen(store, directory)
    assert await ids(store) == ["t0", "t1"]
    await store.append_turns("s", [turn(2)])
    assert await ids(store) == ["t0", "t1", "t2"]
    await store.aclose()
    assert await ids_in(directory) == ["t0", "t1", "t2"]
    assert path.read_text().splitlines() == [encode_str(turn(i)) for i in range(3)]


# -- item 9: a torn tail (partial JSON or partial UTF-8) is a truncated last line ------------


async def test_every_cut_of_the_last_line_is_a_truncated_line(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0), turn(1), manifest=False)).aclose()
    path = directory / "turns.jsonl"
    complete = path.read_bytes()
    line = encode_str(turn(2)).encode()
    assert len(line) > len(encode_str(turn(2))), "the line has multi-byte characters"
    for cut in range(1, len(line)):
        path.write_bytes(complete + line[:cut])
        with pytest.warns(CorruptDataWarning, match="turns.jsonl line 3 is truncated"):
            assert await ids_in(directory) == ["t0", "t1"], cut
    path.write_bytes(complete + line[:-1])
    store = store_on(directory)
    with pytest.warns(CorruptDataWarning):
        await store.append_turns("s", [turn(3)])
    assert await ids(store) == ["t0", "t1", "t3"]
    assert path.read_bytes() == complete + encode_str(turn(3)).encode() + b"\n"
    await store.aclose()


async def test_cut_inside_a_character_leaves_the_session_writable(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0), manifest=False)).aclose()
    path = directory / "turns.jsonl"
    line = encode_str(turn(1)).encode()
    cut = line.index("€".encode()) + 1  # inside the three bytes of "€"
    with path.open("ab") as f:
        f.write(line[:cut])
    store = store_on(directory)
    with pytest.warns(CorruptDataWarning, match="line 2 is truncated"):
        loaded = await store.load("s")
    assert loaded is not None and [t.id for t in loaded.turns] == ["t0"]
    with pytest.warns(CorruptDataWarning):
        await store.append_turns("s", [turn(2)])
    await store.aclose()
    assert await ids_in(directory) == ["t0", "t2"]


async def test_bad_bytes_in_the_middle_are_a_located_error(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0), turn(1), turn(2), manifest=False)).aclose()
    path = directory / "turns.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace("€".encode(), b"\xe2\x82")  # a cut character mid-file
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl line 2 is not UTF-8"):
        await ids_in(directory)
    path.write_bytes(b"\n".join(lines[:1] + lines[2:]))
    meta = directory / "meta.json"
    meta.write_bytes(meta.read_bytes()[:-1] + b"\xc3")
    with pytest.raises(CorruptDataError, match=r"meta\.json"):
        await ids_in(directory)


# -- item 10: foreign files are neither read, nor rewritten, nor deleted ---------------------


async def test_foreign_files_are_left_alone(tmp_path: Path, secret: Path) -> None:
    directory = tmp_path / "sess"
    directory.mkdir()
    (directory / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1\xff\xfe\x80")
    (directory / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")
    (directory / "meta.json~").write_text('{"id": "old"}')
    (directory / "#turns.jsonl#").write_text("half an edit")
    (directory / ".turns.jsonl.swp").write_bytes(b"b0VIM 9.0\x00\xff")
    (directory / ".notes.tmp").write_text("someone else's temp file")
    (directory / "notes.txt").symlink_to(secret)
    (directory / "sub").mkdir()
    os.mkfifo(directory / "pipe")
    foreign = entries(directory)

    store = store_on(directory)
    await store.save(session(turn(0)))
    await store.append_turns("s", [turn(1)])
    await store.patch_meta("s", {"k": "v"})
    await store.claim_send_request("s", "q", "fp")
    store = await reopen(store, directory)
    assert await ids(store) == ["t0", "t1"]
    assert {k: v for k, v in entries(directory).items() if k in foreign} == foreign
    await store.delete("s")
    assert await store.load("s") is None
    await store.aclose()
    assert entries(directory) == foreign


# -- item 11: a save is all-or-nothing; appends write only what they append ------------------


async def test_append_writes_only_the_appended_bytes(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    store = await saved(directory, *(turn(i) for i in range(50)))
    path = directory / "turns.jsonl"
    before = path.read_bytes()
    with path.open("rb") as witness:  # the file as it was: sees the appends if not replaced
        for i in range(50, 53):
            await store.append_turns("s", [turn(i)])
        appended = "".join(encode_str(turn(i)) + "\n" for i in range(50, 53)).encode()
        assert path.read_bytes() == before + appended
        assert witness.read() == before + appended


async def test_hard_linked_file_is_replaced_not_written_through(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    store = await saved(directory, turn(0))
    path = directory / "turns.jsonl"
    os.link(path, tmp_path / "elsewhere")  # a backup by hard link, or a planted link
    before = (tmp_path / "elsewhere").read_bytes()
    await store.append_turns("s", [turn(1)])
    assert (tmp_path / "elsewhere").read_bytes() == before
    await store.aclose()
    assert await ids_in(directory) == ["t0", "t1"]
    assert os.stat(path).st_nlink == 1


def crashed_mid_append(directory: Path, tail: bytes) -> None:
    """Leave ``directory`` as a writer killed after appending ``tail``, before its commit:
    the lock file it never released records where its append started."""
    path = directory / "turns.jsonl"
    generation = json.loads((directory / MANIFEST).read_text())["generation"]
    record = {"pid": 1, "generation": generation, "appending": {"turns.jsonl": path.stat().st_size}}
    (directory / LOCK).write_text(json.dumps(record))
    with path.open("ab") as f:
        f.write(tail)


CUT = r"turns\.jsonl: the \d+ bytes an append wrote before it was cut short by a crash were"


async def test_uncommitted_append_is_invisible_and_replaced(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    path = directory / "turns.jsonl"
    committed = path.read_bytes()
    crashed_mid_append(
        directory, encode_str(turn(1)).encode() + b"\n" + encode_str(turn(2)).encode()[:9]
    )
    store = store_on(directory)
    with pytest.warns(CorruptDataWarning, match=CUT):
        assert await ids(store) == ["t0"]  # the tail never committed: cut
    assert path.read_bytes() == committed
    await store.append_turns("s", [turn(3)])
    assert path.read_bytes() == committed + encode_str(turn(3)).encode() + b"\n"
    await store.aclose()
    assert not (directory / LOCK).exists()


async def test_stale_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    stale = [".meta.json.0123456789ab.tmp", ".turns.jsonl.abcdef012345.tmp"]
    stale.append(f"{MANIFEST}.00112233aabb.tmp")
    for name in stale:
        (directory / name).write_text("left by a crash")
    (directory / ".other.tmp").write_text("not ours")
    (directory / ".a.b.0123456789ab.tmp").mkdir()  # a directory is never ours
    assert await ids_in(directory) == ["t0"]
    assert sorted(os.listdir(directory)) == [
        ".a.b.0123456789ab.tmp",
        ".other.tmp",
        MANIFEST,
        "meta.json",
        "turns.jsonl",
    ]


async def test_hand_made_directory_with_custom_names(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    directory.mkdir()
    (directory / "m.json").write_text(encode_str(session()))
    (directory / "t.jsonl").write_text(encode_str(turn(0)) + "\n")
    (directory / "meta.json").write_text("not this session's file")
    options = FileMapStoreOptions(meta_file="m.json", turns_file="t.jsonl")
    adapter = DirectoryFileMapAdapter(directory, names=["m.json", "t.jsonl"])
    store = create_file_map_store(adapter, options)
    await store.append_turns("s", [turn(1)])
    await store.aclose()
    store = create_file_map_store(DirectoryFileMapAdapter(directory), options)
    assert await ids(store) == ["t0", "t1"]
    await store.aclose()
    assert (directory / "meta.json").read_text() == "not this session's file"
    with pytest.raises(ValidationError, match="not a string"):
        DirectoryFileMapAdapter(directory, names="m.json")
    with pytest.raises(InvalidNameError):
        DirectoryFileMapAdapter(directory, names=["../m.json"])


async def test_damage_outside_the_store_is_located(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0), turn(1))).aclose()
    path = directory / "turns.jsonl"
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl holds \d+ bytes, fewer than"):
        await ids_in(directory)
    path.unlink()
    with pytest.raises(CorruptDataError, match=r"turns\.jsonl is missing"):
        await ids_in(directory)
    (directory / MANIFEST).write_text('{"generation": 1}')
    with pytest.raises(CorruptDataError, match=r"\.zidane-filemap\.json does not decode"):
        await ids_in(directory)


# -- two writers of one directory -----------------------------------------------------------

PEER = """
import sys, trio
from zidane_actors.errors import StoreLockedError
from zidane_actors.stores import open_directory_adapter

async def main() -> None:
    try:
        async with open_directory_adapter(sys.argv[1]):
            print("opened", flush=True)
            if sys.argv[2:] == ["hold"]:
                await trio.sleep_forever()
    except StoreLockedError as exc:
        print("refused:", exc, flush=True)

trio.run(main)
"""
"""Another process opening a directory: prints ``opened`` or ``refused: <error>``."""


async def peer_opens(directory: Path) -> str:
    done = await trio.run_process([sys.executable, "-c", PEER, str(directory)], capture_stdout=True)
    return done.stdout.decode().strip()


async def test_second_process_is_refused_while_a_store_has_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    async with open_directory_adapter(directory) as adapter:
        store = create_file_map_store(adapter)
        await store.save(session(turn(0)))
        answer = await peer_opens(directory)
        assert answer.startswith("refused:"), answer
        assert f"{directory} is open by another file-map store (process {os.getpid()})" in answer
        await store.append_turns("s", [turn(1)])
        assert await ids(store) == ["t0", "t1"]
    assert await peer_opens(directory) == "opened"  # closing released it
    assert await ids_in(directory) == ["t0", "t1"]


async def test_second_store_in_this_process_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    first = await saved(directory, turn(0))
    second = store_on(directory)
    held = (
        rf"{re.escape(str(directory))} is open by another file-map store \(process {os.getpid()}\)"
    )
    with pytest.raises(StoreLockedError, match=held):
        await second.load("s")
    with pytest.raises(StoreLockedError, match=held):
        await second.append_turns("s", [turn(1)])
    with pytest.raises(StoreLockedError, match=held):
        async with open_directory_adapter(directory):
            pass
    await first.append_turns("s", [turn(2)])
    await first.aclose()
    assert await ids(second) == ["t0", "t2"]  # the first one is gone: the lock is free
    await second.aclose()


async def test_killed_holder_leaves_the_directory_free(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", PEER, str(directory), "hold"], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert (await holder.stdout.receive_some(100)).startswith(b"opened")
        with pytest.raises(StoreLockedError, match=f"process {holder.pid}"):
            await ids_in(directory)
    finally:
        holder.kill()  # no cleanup: the kernel drops its lock
        await holder.wait()
        await holder.stdout.aclose()
    assert await ids_in(directory) == ["t0"]


def test_two_servers_on_one_directory_the_second_refuses(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'map'}"
    first = ServerProcess(url)
    first.start()
    try:
        assert first.proc is not None
        second = subprocess.run(
            [sys.executable, "-m", "zidane_actors.cli", "serve", "--store", url, "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, second
        assert second.stdout == ""  # never listened
        assert len(second.stderr.splitlines()) == 1, second.stderr
        assert f"is open by another file-map store (process {first.proc.pid})" in second.stderr
    finally:
        assert first.stop() == 0


def zidane_appends(directory: Path, *turn_ids: str) -> None:
    """Append turns as zidane's own file-map store writes them: one compact JSON line each,
    shaped like the lines already there (its adapter knows nothing of our manifest)."""
    path = directory / "turns.jsonl"
    shape = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    with path.open("a", encoding="utf-8") as f:
        for turn_id in turn_ids:
            line = {**shape, "id": turn_id, "content": [{"type": "text", "text": f"z {turn_id}"}]}
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")


async def test_lines_another_writer_appended_are_read_and_kept(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    zidane_appends(directory, "z1", "z2")  # while no store of ours has it open
    store = store_on(directory)
    assert await ids(store) == ["t0", "z1", "z2"]  # a plain append: no warning
    await store.append_turns("s", [turn(3)])
    zidane_appends(directory, "z4")  # while ours has it open (zidane takes no lock)
    assert await ids(store) == ["t0", "z1", "z2", "t3", "z4"]
    await store.append_turns("s", [turn(5)])
    await store.aclose()
    assert await ids_in(directory) == ["t0", "z1", "z2", "t3", "z4", "t5"]
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["files"]["turns.jsonl"] == (directory / "turns.jsonl").stat().st_size


async def test_crashed_append_is_cut_and_another_writers_lines_before_it_kept(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    zidane_appends(directory, "z1")  # read by our next writer, which is killed mid-append
    crashed_mid_append(directory, encode_str(turn(2)).encode() + b"\n")
    store = store_on(directory)
    with pytest.warns(CorruptDataWarning, match=CUT):
        assert await ids(store) == ["t0", "z1"]
    await store.append_turns("s", [turn(3)])
    await store.aclose()
    assert await ids_in(directory) == ["t0", "z1", "t3"]


async def test_lines_appended_between_our_read_and_our_write_are_kept(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    adapter = DirectoryFileMapAdapter(directory)
    files = await adapter.get()
    zidane_appends(directory, "z1")
    files["turns.jsonl"] += encode_str(turn(2)) + "\n"  # built on what we read
    await adapter.save(files)
    await adapter.aclose()
    assert await ids_in(directory) == ["t0", "z1", "t2"]


class _RacedAdapter(DirectoryFileMapAdapter):
    """Another writer appends a line while a save is being written (once, when armed)."""

    armed = False

    def _only_link(self, dir_fd: int, name: str) -> bool:
        if self.armed:
            self.armed = False
            zidane_appends(Path(self.path), "z1")
        return super()._only_link(dir_fd, name)


async def test_append_racing_another_writers_line_fails_and_writes_nothing(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    adapter = _RacedAdapter(directory)
    store = create_file_map_store(adapter)
    assert await ids(store) == ["t0"]
    adapter.armed = True
    with pytest.raises(ConflictError, match=r"turns\.jsonl grew while this save was written"):
        await store.append_turns("s", [turn(2)])
    assert await ids(store) == ["t0", "z1"]  # their line whole, nothing of ours
    await store.append_turns("s", [turn(2)])  # the retry goes after it
    await store.aclose()
    assert await ids_in(directory) == ["t0", "z1", "t2"]  # and no crash cut on reopen


async def test_meta_rewritten_by_another_writer_loads_with_a_warning(tmp_path: Path) -> None:
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0))).aclose()
    path = directory / "meta.json"
    meta = json.loads(path.read_text())
    meta["metadata"] = {"title": "renamed by zidane", "tags": ["longer", "than", "before"]}
    path.write_text(json.dumps(meta, separators=(",", ":")))
    store = store_on(directory)
    rewritten = r"meta\.json was rewritten outside the store \(\d+ bytes committed, \d+ now\)"
    with pytest.warns(ExternalChangeWarning, match=rewritten):
        loaded = await store.load("s")
    assert loaded is not None and loaded.metadata == meta["metadata"]
    assert [t.id for t in loaded.turns] == ["t0"]
    await store.append_turns("s", [turn(1)])  # commits the file as it is now
    meta["metadata"] = {}
    path.write_text(json.dumps(meta))  # shorter this time
    with pytest.warns(ExternalChangeWarning, match=rewritten):
        loaded = await store.load("s")
    assert loaded is not None and loaded.metadata == {}
    assert [t.id for t in loaded.turns] == ["t0", "t1"]
    await store.aclose()


@pytest.mark.parametrize("text", ["ünï €uro 𝄞", "a lone surrogate \ud800, NUL \x00"])
async def test_stripped_final_newline_loads_with_a_warning(tmp_path: Path, text: str) -> None:
    # The last line is whole JSON whatever it holds (lone surrogates are escapes).
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0), turn(1, text))).aclose()
    path = directory / "turns.jsonl"
    path.write_bytes(path.read_bytes()[:-1])  # an editor's "no newline at end of file"
    store = store_on(directory)
    with pytest.warns(ExternalChangeWarning, match=r"turns\.jsonl lost its final newline"):
        assert await ids(store) == ["t0", "t1"]
    await store.append_turns("s", [turn(2)])
    lines = [encode_str(turn(0)), encode_str(turn(1, text)), encode_str(turn(2))]
    assert path.read_text().splitlines() == lines
    assert path.read_bytes().endswith(b"\n")
    await store.aclose()
    assert await ids_in(directory) == ["t0", "t1", "t2"]


@pytest.mark.parametrize("cut", [2, 7, 200])
async def test_committed_turn_bytes_cut_are_an_error(tmp_path: Path, cut: int) -> None:
    """Cut past the final newline (2: the newline and the last turn's closing brace)."""
    directory = tmp_path / "sess"
    await (await saved(directory, turn(0), turn(1))).aclose()
    path = directory / "turns.jsonl"
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(CorruptDataError, match=rf"{re.escape(str(path))} holds \d+ bytes, fewer"):
        await ids_in(directory)


async def _state(store: Any, request_ids: list[str]) -> tuple[Any, ...] | None:
    """What a crash must keep whole: metadata, turns, runs and claimed send ids."""
    data = await store.load("s")
    if data is None:
        return None
    claimed = [r for r in request_ids if await store.find_send_request("s", r) is not None]
    return (data.metadata, data.turns, data.runs, claimed)


async def _state_in(directory: Path, request_ids: list[str]) -> tuple[Any, ...] | None:
    store = store_on(directory)
    try:
        return await _state(store, request_ids)
    finally:
        await store.aclose()


def _model(ops: list[worker.Op], request_ids: list[str]) -> tuple[Any, ...] | None:
    """The state after ``ops`` in the reference model (the memory store)."""

    async def run() -> tuple[Any, ...] | None:
        async with open_memory_store() as store:
            for op in ops:
                await worker.apply(store, op)
            return await _state(store, request_ids)

    return trio.run(run)


def _temps(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.endswith(".tmp")] if directory.exists() else []


SELF_KILLS = 24
"""Children that SIGKILL themselves at a seeded file-system call of the save protocol."""
PARENT_KILLS = 8
"""Children the parent SIGKILLs after a seeded number of acknowledged operations."""


def test_killed_writer_leaves_one_acknowledged_state(tmp_path: Path) -> None:
    """Every load after a SIGKILL equals the last acknowledged state (or the one in flight
    when its commit completed): never a mix of two saves, no acknowledged turn lost."""
    directory = tmp_path / "sess"
    rng = random.Random(1311)
    history: list[worker.Op] = []
    seen: Counter[str] = Counter()
    server = subprocess.Popen(
        [sys.executable, WORKER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for round_ in range(SELF_KILLS + PARENT_KILLS):
            ops = worker.plan(round_)
            kill_at = rng.randint(1, 160) if round_ < SELF_KILLS else 0
            server.stdin.write(f"{round_} {kill_at}\n")
            server.stdin.flush()
            kill_after = rng.randint(1, 8) if not kill_at else None
            acked, pid, status = 0, None, None
            while status is None:
                kind, _, value = server.stdout.readline().partition(" ")
                assert kind, "the worker died"
                if kind == "ack":
                    acked += 1
                elif kind == "pid":
                    pid = int(value)
                else:
                    status = int(value)
                if pid is not None and acked == kill_after:
                    os.kill(pid, signal.SIGKILL)
                    kill_after = None
            assert status == 0 or os.WTERMSIG(status) == signal.SIGKILL, status
            seen["temps left"] += bool(_temps(directory))

            request_ids = [f"q{tag}" for kind, tag, _ in history + ops if kind == "claim"]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                state = trio.run(_state_in, directory, request_ids)
            seen["tails cut"] += any("were dropped" in str(w.message) for w in caught)
            candidates = [history + ops[:acked]]
            if acked < len(ops):
                candidates.append(history + ops[: acked + 1])
            matching = [c for c in candidates if _model(c, request_ids) == state]
            assert matching, f"round {round_} (kill at {kill_at}, {acked} acked): mixed state"
            seen["in flight committed"] += matching[0] is not candidates[0]
            history = matching[0]
            assert _temps(directory) == []  # cleaned on open
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    # The seeded kill points reach inside the protocol: before and after its commit point.
    assert seen["temps left"] > 0 and seen["in flight committed"] > 0, seen
    assert seen["tails cut"] > 0, seen  # appends killed before their commit: their bytes cut


# -- another local user ------------------------------------------------------------------------

NOBODY = 65534


def as_nobody(action: Any) -> str:
    """``action()`` (a sync callable answering text) run in a forked child as user ``nobody``.

    Root passes every permission check, so the child drops to ``nobody`` first (the modules
    it needs are imported here, before the fork: ``nobody`` may not read the interpreter's
    own files). Skips when this process cannot drop privileges (it is not root).
    """
    if os.geteuid() != 0:
        pytest.skip("dropping to another user needs root")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            answer = action()
        except BaseException as exc:
            answer, code = f"{type(exc).__name__}: {exc}", 1
        os.write(write, answer.encode())
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


@contextlib.contextmanager
def held_as_root(directory: Path) -> Iterator[None]:
    """The directory's lock held as a store of root's holds it: its file (mode 0600) flocked.

    (A store's own lock cannot be held across the fork: the child runs trio afresh.)
    """
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b'{"pid":%d}' % os.getpid())
        yield
    finally:
        os.close(fd)
        (directory / LOCK).unlink()


def _nobody_session_write(directory: Path) -> str:
    """As the child: open a store on ``directory``, read it, then try to write a session."""

    async def main() -> str:
        store = store_on(directory)
        try:
            held = await store.load("s")
            try:
                await store.save(session(turn(9)))
            except (StoreLockedError, StoreReadOnlyError) as exc:
                return f"read {held is not None}; refused {type(exc).__name__}: {exc}"
            return f"read {held is not None}; wrote"
        except (StoreLockedError, StoreReadOnlyError) as exc:
            return f"refused {type(exc).__name__}: {exc}"
        finally:
            await store.aclose()

    return trio.run(main)


def _shared_directory(tmp_path: Path, mode: int) -> Path:
    """A directory ``nobody`` can reach (``tmp_path`` is private to root) with ``mode``."""
    outer = tmp_path / "shared"
    outer.mkdir()
    outer.chmod(0o755)
    for parent in [tmp_path, *tmp_path.parents]:
        if parent == Path("/tmp"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)  # pytest's own temp directories are 0700
    directory = outer / "sess"
    directory.mkdir(mode=mode)
    directory.chmod(mode)
    return directory


def test_another_users_lock_is_refused_not_bypassed(tmp_path: Path) -> None:
    """A directory this user may write, whose lock file (0600) another user's store holds:
    the lock cannot be opened, so the store refuses (it went on without the lock, and wrote)."""
    directory = _shared_directory(tmp_path, 0o777)  # writable by every user
    _nobody_session_write(tmp_path / "warm")  # imports what the child will need, as root

    with held_as_root(directory):
        answer = as_nobody(lambda: _nobody_session_write(directory))
    assert answer.startswith("refused StoreLockedError:"), answer
    assert "cannot be opened by this user" in answer
    assert list(directory.iterdir()) == []  # nothing written (the lock file went with root's)


def test_a_directory_read_only_for_this_user_is_read_without_the_lock_never_written(
    tmp_path: Path,
) -> None:
    """Read-only for this user (whether or not another store holds its lock): read without
    the lock, and every write refused as ``StoreReadOnlyError`` (a ``PermissionError``)."""
    directory = _shared_directory(tmp_path, 0o700)

    async def write_as_root() -> None:
        store = store_on(directory)
        await store.save(session(turn(0)))
        await store.aclose()

    trio.run(write_as_root)
    for name in directory.iterdir():
        name.chmod(0o644)
    directory.chmod(0o755)  # readable, not writable, by other users
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    answer = as_nobody(lambda: _nobody_session_write(directory))
    assert answer.startswith("read True; refused StoreReadOnlyError:"), answer
    assert "is read-only for this user" in answer

    with held_as_root(directory):
        answer = as_nobody(lambda: _nobody_session_write(directory))
    assert answer.startswith("read True; refused StoreReadOnlyError:"), answer
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert issubclass(StoreReadOnlyError, PermissionError)
