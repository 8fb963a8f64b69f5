"""The ``serve`` command end to end: a real server process and a real HTTP client.

``ServerProcess`` is also the harness of the remote-store, fault and fuzz tests.
"""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest

from zidane_actors.errors import RemoteStoreError
from zidane_actors.model import (
    MAX_SEARCH_WORDS,
    SessionData,
    SessionTurn,
    TextBlock,
    decode,
    encode,
)
from zidane_actors.stores import create_remote_store

READY_TIMEOUT_S = 20.0
SERVE_MEMORY = (sys.executable, "-m", "zidane_actors.cli", "serve", "--store", "memory")


class ServerProcess:
    """``zidane-actors serve`` as a subprocess on 127.0.0.1; ``url`` once ready."""

    def __init__(
        self,
        store: str,
        *,
        port: int = 0,
        token: str | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.port = port
        self.token = token
        self.env = dict(env or {})
        self.args = tuple(args)
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.stderr = ""

    def start(self) -> str:
        """Start the process and wait for the printed listening URL."""
        argv = [sys.executable, "-m", "zidane_actors.cli", "serve", "--store", self.store]
        argv += ["--port", str(self.port), *self.args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZIDANE_ACTORS_")}
        if self.token is not None:
            env["ZIDANE_ACTORS_TOKEN"] = self.token
        env.update(self.env)
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.kill()
            assert self.proc.stderr is not None
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()!r}")
        self.url = line.removeprefix("listening on ").strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        assert self.proc.stdout.readline() == f"session browser: {self.url}/ui/\n"
        return self.url

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        finally:
            self.kill()
            if self.proc.stderr is not None:
                self.stderr = self.proc.stderr.read()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()

    def restart(self) -> str:
        """Kill and start again on the same port and store."""
        self.kill()
        deadline = time.monotonic() + 10
        while True:
            try:
                return self.start()
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(f"sqlite:{tmp_path / 'sessions.db'}")
    server.start()
    yield server
    server.stop()


def _turn(n: int) -> SessionTurn:
    return SessionTurn(
        id=f"t{n}", role="user", content=(TextBlock(text=f"message {n}"),), created_at=n
    )


async def test_serve_sqlite_round_trip_over_http(sqlite_server: ServerProcess) -> None:
    json = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=sqlite_server.url, headers=json) as client:
        session = SessionData(id="s1", created_at=1, updated_at=1)
        r = await client.put("/sessions/s1", content=encode(session))
        assert r.status_code == 204
        body = b'{"turns": [' + encode(_turn(1)) + b"," + encode(_turn(2)) + b"]}"
        r = await client.post("/sessions/s1/turns", content=body)
        assert r.status_code == 204
        r = await client.get("/sessions/s1")
        loaded = decode(r.content, SessionData)
        assert [t.id for t in loaded.turns] == ["t1", "t2"]
        r = await client.get("/sessions", params={"limit": "5"})
        assert r.json() == {"ids": ["s1"]}
        r = await client.get("/openapi.json")
        assert r.json()["openapi"] == "3.1.0"


async def test_integers_past_64_bits_are_refused_not_crashed(
    sqlite_server: ServerProcess,
) -> None:
    big = 2**63 + 5
    async with httpx.AsyncClient(base_url=sqlite_server.url) as client:
        r = await client.put("/sessions/s1", json={"id": "s1", "createdAt": big, "updatedAt": 1})
        assert r.status_code == 422
        assert r.json()["error"]["path"] == "$.createdAt"
        r = await client.post("/schedules/x/claim-fire", json={"dueAt": big, "next": None})
        assert r.status_code == 422
        assert (await client.get("/sessions/s1")).status_code == 404


async def test_serve_survives_restart_on_the_same_file(sqlite_server: ServerProcess) -> None:
    async with create_remote_store(sqlite_server.url) as store:
        await store.save(SessionData(id="s1", created_at=1, updated_at=1))
        await store.append_turns("s1", [_turn(1)])
        sqlite_server.restart()
        data = await store.load("s1")
        assert data is not None
        assert [t.id for t in data.turns] == ["t1"]


async def test_serve_requires_the_configured_token(tmp_path: Path) -> None:
    server = ServerProcess("memory", token="s3cret")
    url = server.start()
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/sessions")).status_code == 401
            wrong = {"authorization": "Bearer nope"}
            assert (await client.get("/sessions", headers=wrong)).status_code == 401
            good = {"authorization": "Bearer s3cret"}
            assert (await client.get("/sessions", headers=good)).json() == {"ids": []}
        async with create_remote_store(url, headers=good) as store:
            assert await store.list() == []
        async with create_remote_store(url) as store:
            with pytest.raises(RemoteStoreError, match="401"):
                await store.list()
    finally:
        assert server.stop() == 0, "SIGTERM must stop the server cleanly"


async def test_serve_reads_the_token_from_the_environment() -> None:
    server = ServerProcess("memory", env={"ZIDANE_ACTORS_TOKEN": "from-env"})
    url = server.start()
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/sessions")).status_code == 401
            r = await client.get("/sessions", headers={"authorization": "Bearer from-env"})
            assert r.status_code == 200
    finally:
        server.stop()


def test_serve_reports_a_busy_port_in_one_line() -> None:
    first = ServerProcess("memory")
    first.start()
    try:
        proc = subprocess.run(
            [*SERVE_MEMORY, "--port", str(first.port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 1
        assert proc.stderr.startswith("zidane-actors: error:")
        assert "Traceback" not in proc.stderr
    finally:
        first.stop()


async def test_search_text_past_the_bound_is_refused_located(
    sqlite_server: ServerProcess,
) -> None:
    """Thousands of words (SQLite once answered 500) or one huge word: a located 422."""
    many = " ".join(f"w{i}" for i in range(MAX_SEARCH_WORDS + 1))
    async with httpx.AsyncClient(base_url=sqlite_server.url) as client:
        await client.put("/sessions/s1", json={"id": "s1", "createdAt": 1, "updatedAt": 1})
        for text in (many, " ".join(["w"] * 2_000), "x" * 3_000):
            r = await client.get("/session-search", params={"text": text})
            assert r.status_code == 422, r.text
            assert r.json()["error"]["path"] == "$.text"
            assert "search text" in r.json()["error"]["message"]
            r = await client.get("/ui/fragments/sessions", params={"q": text})
            assert r.status_code == 400, r.text
        r = await client.get("/session-search", params={"text": many.rsplit(" ", 1)[0]})
        assert r.status_code == 200 and r.json()["rows"] == []


async def test_a_row_nested_past_what_a_write_stores_is_corrupt_and_named(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    """Another program's turn body and metadata nested 980 deep: the listing, meta and
    search answer 200 with those sessions flagged corrupt, and their own routes answer
    ``corrupt_data`` naming them (once a 500 naming no session, for every listing)."""
    deep = "[" * 980 + "]" * 980
    json = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=sqlite_server.url, headers=json) as client:
        for sid in ("good", "deepturn", "deepmeta"):
            session = SessionData(id=sid, created_at=1, updated_at=2, turns=(_turn(1),))
            assert (
                await client.put(f"/sessions/{sid}", content=encode(session))
            ).status_code == 204
        with sqlite3.connect(tmp_path / "sessions.db") as db:
            (body,) = db.execute("SELECT body FROM turns WHERE session_id = 'deepturn'").fetchone()
            deep_body = bytes(body)[:-1] + b',"providerData":{"x":' + deep.encode() + b"}}"
            db.execute("UPDATE turns SET body = ? WHERE session_id = 'deepturn'", (deep_body,))
            db.execute(
                "UPDATE sessions SET metadata = ? WHERE id = 'deepmeta'", (f'{{"x":{deep}}}',)
            )
        r = await client.get("/session-meta")
        assert r.status_code == 200, r.text
        corrupt = {row["id"]: row.get("corrupt") for row in r.json()}
        assert corrupt["good"] is None
        assert "MAX_STORED_JSON_DEPTH" in corrupt["deepturn"]
        assert "MAX_STORED_JSON_DEPTH" in corrupt["deepmeta"]
        for params in ({}, {"text": "message"}):
            r = await client.get("/session-search", params=params)
            assert r.status_code == 200, r.text
            assert {row["id"] for row in r.json()["rows"]} >= {"good"}
        r = await client.get("/session-search")
        assert {row["id"] for row in r.json()["rows"]} == {"good", "deepturn", "deepmeta"}
        assert (await client.get("/ui/fragments/sessions")).status_code == 200
        for sid in ("deepturn", "deepmeta"):
            for path in (f"/sessions/{sid}", f"/sessions/{sid}/meta"):
                r = await client.get(path)
                assert r.status_code == 500, r.text
                assert r.json()["error"]["code"] == "corrupt_data"
                assert repr(sid) in r.json()["error"]["message"]
        assert (await client.get("/sessions/good")).status_code == 200
