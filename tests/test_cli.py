"""``zidane-actors`` against real stores.

Exit codes, error lines, the default store and ``copy`` run the CLI as a
subprocess; the output of the other commands is checked through
``main(argv)`` in process (a subprocess costs ~1 s of imports).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from test_server_e2e import ServerProcess

from zidane_actors.cli import main
from zidane_actors.model import (
    SessionData,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    encode_str,
)
from zidane_actors.stores import create_remote_store


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` in process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zidane_actors.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def session() -> SessionData:
    return SessionData(
        id="s1",
        created_at=1_700_000_000_000,
        updated_at=1_700_000_100_000,
        status="completed",
        metadata={"title": "Reading hosts"},
        agent_id="coder",
        turns=(
            SessionTurn(
                id="u1", role="user", content=(TextBlock("read /etc/hosts"),), created_at=1
            ),
            SessionTurn(
                id="a1",
                role="assistant",
                content=(
                    TextBlock("Reading it."),
                    ToolCallBlock(id="call_1", name="read", input={"path": "/etc/hosts"}),
                ),
                created_at=2,
                run_id="r1",
            ),
            SessionTurn(
                id="tr1",
                role="user",
                content=(ToolResultBlock(call_id="call_1", output="127.0.0.1 localhost"),),
                created_at=3,
                run_id="r1",
            ),
            SessionTurn(
                id="a2", role="assistant", content=(TextBlock("It maps localhost."),), created_at=4
            ),
        ),
        runs=(
            SessionRun(id="r1", prompt="read /etc/hosts", started_at=1, status="completed"),
            SessionRun(
                id="r2", prompt="sub task", started_at=2, status="completed", parent_run_id="r1"
            ),
        ),
    )


def broken() -> SessionData:
    """A session with a duplicated tool result and an orphan one."""
    call = ToolCallBlock(id="c1", name="ls", input={})
    return SessionData(
        id="broken",
        created_at=1,
        updated_at=2,
        turns=(
            SessionTurn(id="u", role="user", content=(TextBlock("go"),), created_at=1),
            SessionTurn(id="a", role="assistant", content=(call,), created_at=2),
            SessionTurn(
                id="r",
                role="user",
                content=(
                    ToolResultBlock(call_id="c1", output="one"),
                    ToolResultBlock(call_id="c1", output="again"),
                ),
                created_at=3,
            ),
            SessionTurn(
                id="o",
                role="user",
                content=(ToolResultBlock(call_id="ghost", output="?"),),
                created_at=4,
            ),
        ),
    )


def jsonl(*sessions: SessionData) -> str:
    lines = []
    for data in sessions:
        lines.append(encode_str({"session": msgspec.structs.replace(data, turns=())}))
        lines.extend(encode_str({"turn": t}) for t in data.turns)
    return "\n".join(lines) + "\n"


@pytest.fixture
def db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A SQLite store holding ``session()`` and ``broken()``, imported through the CLI."""
    source = tmp_path / "in.jsonl"
    source.write_text(jsonl(session(), broken()), encoding="utf-8")
    url = f"sqlite:{tmp_path / 'sessions.db'}"
    code, out, err = run(capsys, "sessions", "import", str(source), "--store", url)
    assert code == 0, err
    assert "imported s1 (4 turns, 2 runs)" in out
    return url


def test_usage_errors_exit_2() -> None:
    for argv in (("sessions", "show"), ("serve", "--port", "-1"), ("serve", "--port", "99999")):
        done = cli(*argv)
        assert done.returncode == 2, argv
        assert "Traceback" not in done.stderr
        assert done.stderr.strip()
    assert cli("--help").returncode == 0


def test_usage_errors_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ((), ("sessions",), ("nope",), ("sessions", "list", "--limit", "x")):
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert err.strip()


def test_runtime_errors_are_one_line_exit_1(db: str) -> None:
    for argv in (
        ("sessions", "show", "missing", "--store", db),
        ("sessions", "list", "--store", "http://127.0.0.1:1"),
    ):
        done = cli(*argv)
        assert done.returncode == 1, argv
        assert done.stderr.startswith("zidane-actors: error:"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_no_command_prints_the_usage_on_stderr_exit_2() -> None:
    done = cli()
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("usage: zidane-actors "), done.stderr
    usage, error, hint = done.stderr.splitlines()
    assert usage.startswith("usage: zidane-actors ") and "{serve,sessions,copy}" in usage
    assert error.startswith("zidane-actors: error: ")
    assert hint == "Run 'zidane-actors --help' for more information."


def _command_paths() -> list[list[str]]:
    """Every command line that has a --help: the program, then each (sub)command."""
    from zidane_actors.cli import _parser

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
        paths = [path]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    paths += walk(sub, [*path, name])
        return paths

    return walk(_parser(), [])


def test_every_help_is_plain_text() -> None:
    # Subprocesses started together (each spends its time importing), collected in order.
    paths = _command_paths()
    assert ["sessions", "export"] in paths and ["copy"] in paths
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "zidane_actors.cli", *path, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in paths
    ]
    helps: dict[str, str] = {}
    for path, proc in zip(paths, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and err == "", (path, err)
        assert out.startswith("usage: zidane-actors"), path
        assert "`" not in out, (path, out)  # no reST ``literals`` nor `roles`
        helps[" ".join(path)] = " ".join(out.split())  # argparse wraps lines
    assert "session browser at /ui/: http://127.0.0.1:8787/ui/" in helps["serve"]


def _big_session() -> SessionData:
    """A session whose transcript is far larger than a pipe holds (64 KiB)."""
    return SessionData(
        id="big",
        created_at=1,
        updated_at=2,
        turns=tuple(
            SessionTurn(
                id=f"t{n}", role="user", content=(TextBlock(f"{n} " + "x" * 300),), created_at=n
            )
            for n in range(2000)
        ),
    )


def test_a_reader_that_stops_early_ends_the_output_quietly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sessions show big | head -1``: exit 0 and nothing on stderr, as Unix tools do."""
    source = tmp_path / "big.jsonl"
    source.write_text(jsonl(_big_session()), encoding="utf-8")
    url = f"sqlite:{tmp_path / 'big.db'}"
    assert run(capsys, "sessions", "import", str(source), "--store", url)[0] == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "zidane_actors.cli", "sessions", "show", "big", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    # One line read, then the pipe closed: the ~650 KB transcript cannot all fit before.
    assert proc.stdout.readline() == b"session big\n"
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0, err
    assert err == b""


def test_copy_with_stderr_to_a_file_writes_no_progress_frames(db: str, tmp_path: Path) -> None:
    """``copy 2>log``: progress is for a terminal; a log file gets no ``\\r`` frames."""
    log = tmp_path / "copy.log"
    with log.open("w", encoding="utf-8") as err:
        done = subprocess.run(
            [sys.executable, "-m", "zidane_actors.cli", "copy", "--from", db, "--to", "memory:"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, log.read_text(encoding="utf-8")
    assert "copied 2 session(s)" in done.stdout
    assert log.read_bytes() == b""


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_copy_draws_progress_when_stderr_is_a_terminal(db: str) -> None:
    import os
    import pty
    import select

    master, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zidane_actors.cli", "copy", "--from", db, "--to", "memory:"],
            stdout=subprocess.PIPE,
            stderr=terminal,
        )
        os.close(terminal)
        terminal = -1
        drawn = b""
        while select.select([master], [], [], 60)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the copy exited, no writer left on the terminal
                break
            if not chunk:
                break
            drawn += chunk
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        assert proc.wait(timeout=60) == 0, drawn
    finally:
        os.close(master)
        if terminal >= 0:
            os.close(terminal)
    assert b"copied 2 session(s)" in out
    assert b"\rcopying [" in drawn and b"2/2 sessions" in drawn


def test_version_and_python_dash_m() -> None:
    from zidane_actors import __version__

    done = subprocess.run(
        [sys.executable, "-m", "zidane_actors", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"zidane-actors {__version__}"


def test_every_option_and_subcommand_has_a_help_line() -> None:
    from zidane_actors.cli import _parser

    def walk(parser: argparse.ArgumentParser, where: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    if not helps.get(name):
                        missing.append(f"{where} {name}")
                    missing += walk(sub, f"{where} {name}")
            elif not action.help:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")
        return missing

    assert walk(_parser(), "zidane-actors") == []


def test_import_of_a_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "latin1.jsonl"
    source.write_bytes('{"session": {"id": "caf\xe9"}}\n'.encode("latin-1"))
    code, _, err = run(capsys, "sessions", "import", str(source), "--store", db)
    assert code == 1
    assert err.startswith("zidane-actors: error:") and "not UTF-8" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_runtime_errors_in_process(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ("sessions", "show", "../x", "--store", db),
        ("sessions", "list", "--store", "bogus:thing"),
        ("sessions", "list", "--store", "file:"),
        ("sessions", "import", "/nonexistent.jsonl", "--store", db),
    ):
        code, _, err = run(capsys, *argv)
        assert code == 1, argv
        assert err.startswith("zidane-actors: error:"), err
        assert len(err.strip().splitlines()) == 1, err


def test_list(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "sessions", "list", "--store", db)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["ID", "STATUS", "TURNS"]
    assert [row.split()[0] for row in rows] == ["s1", "broken"]
    assert "Reading hosts" in rows[0]


def test_show_pairs_tool_calls_with_results_and_draws_the_run_tree(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text, err = run(capsys, "sessions", "show", "s1", "--store", db)
    assert code == 0, err
    call = text.index("→ tool call read")
    result = text.index("127.0.0.1 localhost")
    assert call < result < text.index("It maps localhost.")
    assert "[1] user" in text and "[2] assistant" in text
    assert "[3] user" not in text  # the tool-result turn is shown with its call
    assert "- r1 [completed]" in text
    assert "  - r2 [completed]" in text.split("- r1 [completed]")[1]


def test_export_jsonl_round_trips(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "sessions", "export", "s1", "--store", db)
    assert code == 0
    assert out == jsonl(session())
    exported = tmp_path / "s1.jsonl"
    exported.write_text(out, encoding="utf-8")
    other = f"sqlite:{tmp_path / 'other.db'}"
    assert run(capsys, "sessions", "import", str(exported), "--store", other)[0] == 0
    assert run(capsys, "sessions", "export", "s1", "--store", other)[1] == out


def test_export_provider_formats(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    anthropic = json.loads(
        run(capsys, "sessions", "export", "s1", "--format", "anthropic", "--store", db)[1]
    )
    roles = [m["role"] for m in anthropic["messages"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert anthropic["messages"][1]["content"][1]["type"] == "tool_use"
    assert anthropic["messages"][2]["content"][0]["type"] == "tool_result"
    openai = json.loads(
        run(capsys, "sessions", "export", "s1", "--format", "openai", "--store", db)[1]
    )
    roles = [m["role"] for m in openai["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert openai["messages"][1]["tool_calls"][0]["function"]["name"] == "read"


def test_import_reports_bad_lines_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = jsonl(session()).splitlines()
    lines[2] = lines[2].replace('"role":"assistant"', '"role":"robot"')
    lines.insert(4, "{not json")
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    url = f"sqlite:{tmp_path / 'x.db'}"
    done = cli("sessions", "import", str(bad), "--store", url)
    assert done.returncode == 1
    assert f"{bad}:3:" in done.stderr
    assert "$.role" in done.stderr
    assert "(and 1 more)" in done.stderr
    assert cli("sessions", "list", "--store", url).stdout.strip() == "no sessions"


def test_import_refuses_to_overwrite_without_replace(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "again.jsonl"
    source.write_text(jsonl(session()), encoding="utf-8")
    code, _, err = run(capsys, "sessions", "import", str(source), "--store", db)
    assert code == 1
    assert "--replace" in err
    assert run(capsys, "sessions", "import", str(source), "--store", db, "--replace")[0] == 0


def test_heal_persists_drops_and_is_idempotent(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "sessions", "heal", "broken", "--store", db)
    assert code == 0, err
    assert "dropped duplicate-tool-result call c1 in turn r (#3)" in out
    assert "dropped orphan-tool-result call ghost in turn o (#4)" in out
    assert "dropped empty-turn in turn o (#4)" in out
    exported = run(capsys, "sessions", "export", "broken", "--store", db)[1]
    assert "ghost" not in exported and "again" not in exported
    assert "nothing to heal" in run(capsys, "sessions", "heal", "broken", "--store", db)[1]


def test_rm(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "sessions", "rm", "s1", "--store", db)[1].strip() == "deleted s1"
    assert run(capsys, "sessions", "show", "s1", "--store", db)[0] == 1
    assert run(capsys, "sessions", "rm", "s1", "--store", db)[0] == 1


def test_default_store_is_the_sqlite_file_in_the_working_directory(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(jsonl(session()), encoding="utf-8")
    assert cli("sessions", "import", str(source), cwd=tmp_path).returncode == 0
    assert (tmp_path / "zidane-sessions.db").exists()
    assert "s1" in cli("sessions", "list", cwd=tmp_path).stdout


async def test_copy_between_sqlite_and_a_remote_server(db: str, tmp_path: Path) -> None:
    server = ServerProcess("memory")
    url = server.start()
    try:
        done = cli("copy", "--from", db, "--to", url)
        assert done.returncode == 0, done.stderr
        assert "copied 2 session(s)" in done.stdout
        assert done.stderr == ""  # stderr is a pipe, not a terminal: no progress bar
        async with create_remote_store(url) as remote:
            assert await remote.load("s1") == session()
        back = f"sqlite:{tmp_path / 'back.db'}"
        assert cli("copy", "--from", url, "--to", back).returncode == 0
        assert cli("sessions", "export", "s1", "--store", back).stdout == jsonl(session())
    finally:
        server.stop()


def test_file_map_store_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "one.jsonl"
    source.write_text(jsonl(session()), encoding="utf-8")
    url = f"file:{tmp_path / 'map'}"
    assert run(capsys, "sessions", "import", str(source), "--store", url)[0] == 0
    assert (tmp_path / "map" / "turns.jsonl").exists()
    assert run(capsys, "sessions", "export", "s1", "--store", url)[1] == jsonl(session())
    # One session per file map: a second one is refused in one line.
    other = tmp_path / "other.jsonl"
    other.write_text(jsonl(broken()), encoding="utf-8")
    code, _, err = run(capsys, "sessions", "import", str(other), "--store", url)
    assert code == 1
    assert "one session per store" in err


def test_import_of_bytes_that_are_not_utf8_and_a_bad_port_print_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(jsonl(session()).encode() + b'{"session": "caf\xe9"}\n')
    done = cli("sessions", "import", str(bad), "--store", f"sqlite:{tmp_path / 'x.db'}")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "not UTF-8" in done.stderr
    served = cli("serve", "--port", "99999", "--store", "memory")
    assert served.returncode == 2
    assert served.stderr.strip() == "zidane-actors: --port must be a TCP port (0 to 65535)"


def test_import_carries_lone_surrogates_and_unknown_fields(tmp_path: Path) -> None:
    """A JSONL export written by JavaScript (a clipped emoji) or a newer version imports as is."""
    source = tmp_path / "js.jsonl"
    text = jsonl(session()).replace('"Reading hosts"', '"Reading \\ud83d"')
    text = text.replace('"agentId":"coder"', '"agentId":"coder","workspace":{"root":"/w"}')
    source.write_text(text, encoding="utf-8")
    url = f"sqlite:{tmp_path / 'x.db'}"
    done = cli("sessions", "import", str(source), "--store", url)
    assert done.returncode == 0, done.stderr
    exported = cli("sessions", "export", "s1", "--store", url)
    assert exported.returncode == 0, exported.stderr
    assert '"Reading \\ud83d"' in exported.stdout
    assert '"workspace":{"root":"/w"}' in exported.stdout


async def _seed_everything(url: str) -> None:
    """A store holding every kind of data a migration must carry."""
    from zidane_actors.model import (
        RunOwner,
        Schedule,
        ScheduleFire,
        SendRequestRecord,
        SessionArtifact,
        current_run_owner,
    )
    from zidane_actors.stores._url import open_store_url

    async with open_store_url(url) as store:
        full: Any = store
        await store.save(session())
        live = SessionData(
            id="live",
            created_at=1_700_000_000_000,
            updated_at=1_700_000_200_000,
            metadata={"n": 12000, "f": 1.5},
            turns=(SessionTurn(id="l1", role="user", content=(TextBlock("go"),), created_at=1),),
        )
        await store.save(live)
        owner: RunOwner = current_run_owner()
        await store.update_status("live", "running", owner=owner, preserve_updated_at=True)
        await full.upsert_artifact(
            SessionArtifact(
                id="a1",
                session_id="s1",
                kind="link",
                uri="https://example.invalid/pr/1",
                label="PR 1",
                created_at=5,
                updated_at=6,
                meta={"state": "open"},
            )
        )
        await full.put_send_request(
            "s1",
            SendRequestRecord(request_id="req 1", fingerprint="fp", created_at=7, result={"t": 1}),
        )
        await full.put_send_request(
            "live", SendRequestRecord(request_id="req#2", fingerprint="fp2", created_at=8)
        )
        await full.save_schedule(
            Schedule(
                id="nightly",
                prompt="digest",
                enabled=True,
                created_at=1,
                updated_at=2,
                interval_ms=86_400_000,
                next_fire_at=99,
            )
        )
        for n in range(3):
            await full.record_schedule_fire(
                ScheduleFire(
                    id=f"f{n}", schedule_id="nightly", due_at=10 + n, fired_at=11 + n, status="ok"
                )
            )


async def _everything(url: str) -> tuple[Any, ...]:
    from zidane_actors import _transfer as transfer
    from zidane_actors.stores._url import open_store_url

    async with open_store_url(url) as store:
        counts, bundles = await transfer.stored_counts(store)
        schedules = await transfer.schedules_of(store)
        live = await store.load("live")
        assert live is not None
        return counts.values, bundles, schedules, (live.status, live.run_owner, live.updated_at)


async def test_copy_carries_everything_a_store_holds_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite:{tmp_path / 'source.db'}"
    await _seed_everything(source)
    before = await _everything(source)
    assert before[0] == {
        "sessions": 2,
        "turns": 5,
        "runs": 2,
        "artifacts": 1,
        "sendRequests": 2,
        "schedules": 1,
        "fires": 3,
    }
    assert before[3][0] == "running"
    target = f"sqlite:{tmp_path / 'target.db'}"
    code, out, _ = await trio.to_thread.run_sync(
        run, capsys, "copy", "--from", source, "--to", target
    )
    assert code == 0, out
    assert "verified: every copied session reads back byte for byte (2)" in out
    assert (
        "sendRequests           2         2" in out and "fires                  3         3" in out
    )
    assert await _everything(target) == before

    # export --all, then import into an empty store: the same again.
    code, exported, _ = await trio.to_thread.run_sync(
        run, capsys, "sessions", "export", "--store", source
    )
    assert code == 0
    dump = tmp_path / "all.jsonl"
    dump.write_text(exported, encoding="utf-8")
    imported = f"sqlite:{tmp_path / 'imported.db'}"
    code, out, err = await trio.to_thread.run_sync(
        run, capsys, "sessions", "import", str(dump), "--store", imported
    )
    assert code == 0, err
    assert "imported schedule nightly (3 fires)" in out
    assert await _everything(imported) == before


async def test_copy_refuses_a_target_that_would_lose_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite:{tmp_path / 'source.db'}"
    await _seed_everything(source)
    code, _, err = await trio.to_thread.run_sync(
        run, capsys, "copy", "--from", source, "--to", f"file:{tmp_path / 'map'}"
    )
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("zidane-actors: error:") and "would be lost" in last, err


def test_text_holding_lone_surrogates_prints_as_json_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Stored text may hold a lone surrogate (JSON escapes it): a listing, a transcript and
    # the provider exports print it as that escape instead of failing on it.
    odd = SessionData(
        id="odd",
        created_at=1,
        updated_at=2,
        metadata={"k\udc00": "v\ud800"},
        turns=(
            SessionTurn(id="t1", role="user", content=(TextBlock("x\ud800\x00"),), created_at=1),
        ),
    )
    source = tmp_path / "odd.jsonl"
    source.write_text(jsonl(odd), encoding="utf-8")
    url = f"sqlite:{tmp_path / 'odd.db'}"
    assert run(capsys, "sessions", "import", str(source), "--store", url)[0] == 0
    code, out, err = run(capsys, "sessions", "list", "--store", url)
    assert code == 0 and "x\\ud800" in out, err
    code, out, err = run(capsys, "sessions", "show", "odd", "--store", url)
    assert code == 0 and "x\\ud800" in out and "k\\udc00" in out, err
    for form in ("anthropic", "openai"):
        code, out, err = run(capsys, "sessions", "export", "odd", "--format", form, "--store", url)
        assert code == 0, err
        assert "x\ud800\x00" in _strings(json.loads(out))  # the text exactly, read back


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    )
    return [s for child in children for s in _strings(child)]
