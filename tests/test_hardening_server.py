"""Server hardening: what a web page, a slow client or a hostile body can do (real servers).

Every server here is a real process (``zidane-actors serve``) or a real
hypercorn on 127.0.0.1; no traffic leaves the machine.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
import trio
from test_server_e2e import SERVE_MEMORY, ServerProcess

from zidane_actors.errors import StoreUnavailableError, ValidationError
from zidane_actors.model import SessionData, SessionTurn
from zidane_actors.server import ServerLimits, serve
from zidane_actors.stores import create_memory_store, create_remote_store, open_sqlite_store

JSON = {"content-type": "application/json"}
SESSION = b'{"id": "s1", "createdAt": 1, "updatedAt": 1}'


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    process = ServerProcess("memory")
    process.start()
    yield process
    process.stop()


# -- 1. no-token mode: only local programs, never a web page -----------------


async def test_without_token_only_loopback_host_names_with_the_served_port(
    server: ServerProcess,
) -> None:
    port = server.port
    async with httpx.AsyncClient(base_url=server.url) as client:
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"LOCALHOST:{port}",
            f"127.0.0.9:{port}",
        ):
            r = await client.get("/sessions", headers={"host": host})
            assert r.status_code == 200, (host, r.text)
        for host in (
            f"attacker.example:{port}",  # DNS rebinding: the page's own name, our address
            "attacker.example",
            f"127.0.0.1:{port + 1}",
            "127.0.0.1",
            f"localhost.attacker.example:{port}",
            f"10.0.0.1:{port}",
            f"user@127.0.0.1:{port}",
            "",
        ):
            r = await client.get("/sessions", headers={"host": host})
            assert r.status_code == 403, (host, r.text)
            assert r.json()["error"]["code"] == "forbidden_host"
        # Every route goes through the same check, unknown ones and the document included.
        for path in ("/openapi.json", "/sessions/s1", "/no-such-route", "/ui/"):
            r = await client.get(path, headers={"host": f"attacker.example:{port}"})
            assert r.status_code == 403, path


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
async def test_without_token_ipv6_loopback_host() -> None:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve(create_memory_store(), "::1", 0, task_status=task_status)
        )
        port = int(url.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/sessions")).status_code == 200
            r = await client.get("/sessions", headers={"host": f"[::1]:{port}"})
            assert r.status_code == 200
            r = await client.get("/sessions", headers={"host": f"[2001:db8::1]:{port}"})
            assert r.status_code == 403
        nursery.cancel_scope.cancel()


async def test_without_token_a_foreign_origin_is_refused(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=JSON) as client:
        assert (await client.put("/sessions/s1", content=SESSION)).status_code == 204
        claim = b'{"staleAt": 0}'
        for origin in ("http://attacker.example", "null", f"http://localhost:{server.port}"):
            r = await client.post(
                "/sessions/s1/claim-run", content=claim, headers={"origin": origin}
            )
            assert r.status_code == 403, origin
            assert r.json()["error"]["code"] == "forbidden_origin"
            r = await client.get("/sessions", headers={"origin": origin})
            assert r.status_code == 403, origin
        assert (await client.get("/sessions/s1")).json().get("status", "idle") == "idle"
        # The server's own pages may call it.
        r = await client.get("/sessions", headers={"origin": server.url})
        assert r.status_code == 200


async def test_an_answer_before_the_body_was_read_closes_the_connection(
    server: ServerProcess,
) -> None:
    """A refused body is left unread: the answer says so, and no request races a close."""
    async with httpx.AsyncClient(base_url=server.url, headers=JSON) as client:
        ok = await client.put("/sessions/s1", content=SESSION)
        assert ok.status_code == 204
        assert ok.headers.get("connection", "").lower() != "close"
        for _ in range(20):
            refused = await client.post(
                "/sessions/s1/claim-run",
                content=b'{"staleAt": 0}',
                headers={"origin": "http://attacker.example"},
            )
            assert refused.status_code == 403
            assert refused.headers["connection"].lower() == "close"
            bad_type = await client.post(
                "/sessions/s1/claim-run", content=b"{}", headers={"content-type": "text/plain"}
            )
            assert bad_type.status_code == 415
            assert bad_type.headers["connection"].lower() == "close"
            assert (await client.get("/sessions/s1")).status_code == 200


async def test_without_token_write_bodies_must_be_json(server: ServerProcess) -> None:
    """The content types a page may POST without a CORS preflight are refused."""
    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.put("/sessions/s1", content=SESSION, headers=JSON)
        assert r.status_code == 204
        claim = b'{"staleAt": 0}'
        for content_type in (
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonp",
        ):
            r = await client.post(
                "/sessions/s1/claim-run", content=claim, headers={"content-type": content_type}
            )
            assert r.status_code == 415, content_type
            assert r.json()["error"]["code"] == "unsupported_media_type"
        r = await client.post("/sessions/s1/claim-run", content=claim)  # no content type
        assert r.status_code == 415
        r = await client.post("/session-ids", headers={"content-type": "text/plain"})
        assert r.status_code == 415
        assert (await client.get("/sessions/s1")).json().get("status", "idle") == "idle"
        r = await client.post(
            "/sessions/s1/claim-run",
            content=claim,
            headers={"content-type": "Application/JSON; charset=utf-8"},
        )
        assert (r.status_code, r.json()["claimed"]) == (200, True)
        # Bodyless writes need no content type.
        assert (await client.post("/session-ids")).status_code == 200
        assert (await client.delete("/sessions/s1")).status_code == 204


async def test_with_a_token_any_host_is_served() -> None:
    server = ServerProcess("memory", token="k3y")
    server.start()
    try:
        auth = {"authorization": "Bearer k3y", "host": "sessions.example"}
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/sessions", headers=auth)).status_code == 200
            r = await client.get("/sessions", headers={"host": "sessions.example"})
            assert r.status_code == 401
    finally:
        server.stop()


# -- 2. binding beyond loopback, and where the token comes from ---------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "[::]"])
def test_serve_beyond_loopback_without_token_refuses_to_start(host: str) -> None:
    done = subprocess.run(
        [*SERVE_MEMORY, "--host", host, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("ZIDANE_ACTORS_")},
    )
    assert done.returncode != 0
    assert "listening" not in done.stdout
    assert "without a token" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


async def test_token_from_a_file_and_a_warning_for_argv(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-file\n", encoding="utf-8")
    server = ServerProcess("memory", args=["--token-file", str(secret)])
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.get("/sessions", headers={"authorization": "Bearer from-file"})
            assert r.status_code == 200
            assert (await client.get("/sessions")).status_code == 401
    finally:
        server.stop()
    server = ServerProcess("memory", args=["--token", "on-argv"])
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.get("/sessions", headers={"authorization": "Bearer on-argv"})
            assert r.status_code == 200
    finally:
        server.stop()
    assert server.proc is not None
    assert "warning: --token is visible" in server.stderr


# -- 3. slow clients ------------------------------------------------------------

TRICKLERS = 300
TRICKLE_BYTES = 40


async def _trickle(port: int, outcomes: list[bytes], connected: trio.Semaphore) -> None:
    """Declare a 1000-byte body and send it a byte at a time until the server cuts in.

    The outcome is the server's answer, ``b"closed"`` (reset or closed without
    one) or ``b"never"`` (the trickler sent all it had and nothing happened).
    """
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        head = (
            f"PUT /sessions/slow HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            "content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
        )
        await stream.send_all(head.encode())
        connected.release()
        outcome = b"never"
        try:
            for _ in range(TRICKLE_BYTES):
                with trio.move_on_after(0.1):
                    outcome = await stream.receive_some(4096) or b"closed"
                if outcome != b"never":
                    break
                await stream.send_all(b" ")
        except trio.BrokenResourceError:
            outcome = b"closed"
        outcomes.append(outcome)


async def test_slow_bodies_are_cut_off_and_do_not_lock_others_out() -> None:
    # Small limits keep the test short: 16 requests at once, 1 s for a body.
    server = ServerProcess("memory", args=["--max-requests", "16", "--body-timeout", "1"])
    server.start()
    try:
        outcomes: list[bytes] = []
        connected = trio.Semaphore(0, max_value=TRICKLERS)
        async with trio.open_nursery() as nursery:
            for _ in range(TRICKLERS):
                nursery.start_soon(_trickle, server.port, outcomes, connected)
            for _ in range(TRICKLERS):
                await connected.acquire()
            # Every trickler is in; a legitimate client still gets through (503s
            # ask it to come back; the slow bodies are cut off after 1 s).
            async with create_remote_store(server.url, retries=6) as remote:
                await remote.save(SessionData(id="s1", created_at=1, updated_at=1))
                assert await remote.list() == ["s1"]
        assert len(outcomes) == TRICKLERS
        assert b"never" not in outcomes, "a slow body held its request to the end"
        answers = [o for o in outcomes if o != b"closed"]
        statuses = {a.split(b" ", 2)[1] for a in answers}
        assert statuses <= {b"408", b"503"}, statuses
        assert b"503" in statuses
        assert all(b"retry-after: 1" in a.lower() for a in answers if b" 503 " in a)
    finally:
        server.stop()


def _small_budget() -> ServerProcess:
    """A server taking bodies of 100000 bytes at most, 250000 in flight."""
    server = ServerProcess(
        "memory",
        args=["--max-body-bytes", "100000", "--max-body-bytes-in-flight", "250000"],
    )
    server.start()
    return server


async def _hold_body(port: int) -> trio.SocketStream:
    """A connection that declared a 100000-byte body and sent one byte of it."""
    head = (
        f"PUT /sessions/big HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        "content-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    ).encode()
    holder = await trio.open_tcp_stream("127.0.0.1", port)
    await holder.send_all(head + b"{")
    return holder


async def _hold_two_bodies(port: int) -> list[trio.SocketStream]:
    return [await _hold_body(port) for _ in range(2)]


async def _keep_holding(holders: list[trio.SocketStream], port: int) -> None:
    """Replace a holder the server refused (answered): it came while the bytes of an
    earlier answer were still counted, which the client cannot see."""
    for k, holder in enumerate(holders):
        answered = None
        with trio.move_on_after(0.01):
            try:
                answered = await holder.receive_some(4096)
            except trio.BrokenResourceError:  # reset after its answer
                answered = b""
        if answered is not None:
            await holder.aclose()
            holders[k] = await _hold_body(port)


async def test_bodies_in_flight_stay_within_the_memory_budget() -> None:
    server = _small_budget()
    try:
        holders = await _hold_two_bodies(server.port)
        async with httpx.AsyncClient(base_url=server.url, headers=JSON) as client:
            # Once both are being read, 2 x 100000 are held: a third 100000 would pass 250000.
            third = b" " * 100_000
            for _ in range(2000):  # until the server holds both bodies
                await _keep_holding(holders, server.port)
                r = await client.put("/sessions/s2", content=third)
                if r.status_code == 503:
                    break
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "busy"
            # A small body still fits.
            assert (await client.put("/sessions/s1", content=SESSION)).status_code == 204
            for holder in holders:
                await holder.aclose()
        # Once the held bodies are gone (the clients left), a large body fits again.
        async with create_remote_store(server.url, retries=6) as remote:
            big = SessionData(id="s3", created_at=1, updated_at=1, metadata={"x": "y" * 90_000})
            await remote.save(big)
            assert await remote.load("s3") == big
    finally:
        server.stop()


async def test_answers_count_against_the_same_memory_budget() -> None:
    """A big answer waits its turn like a big body; one larger than the budget goes alone."""
    server = _small_budget()
    try:
        text = "x" * 30_000
        async with create_remote_store(server.url) as remote:
            for sid, turns in (("mid", 4), ("huge", 9)):  # answers of ~120 KB and ~270 KB
                await remote.save(SessionData(id=sid, created_at=1, updated_at=1))
                for i in range(turns):
                    turn = {"id": f"t{i}", "role": "user", "createdAt": 1}
                    turn["content"] = [{"type": "text", "text": text}]
                    await remote.append_turns(sid, [msgspec.convert(turn, SessionTurn)])
        async with httpx.AsyncClient(base_url=server.url, headers=JSON) as client:
            holders = await _hold_two_bodies(server.port)
            # Once both bodies are being read, 2 x 100000 are held: the ~120 KB answer
            # would pass 250000 and is refused, with nothing of it sent.
            for _ in range(2000):  # until the server holds both bodies
                await _keep_holding(holders, server.port)
                r = await client.get("/sessions/mid")
                if r.status_code == 503:
                    break
            assert r.status_code == 503
            assert (r.headers["retry-after"], r.json()["error"]["code"]) == ("1", "busy")
            assert (await client.get("/sessions")).status_code == 200  # a small answer fits
            for holder in holders:
                await holder.aclose()
            # Alone (once the server saw the holders leave), an answer larger than the
            # whole budget goes out: no stored session becomes unreadable.
            for _ in range(2000):
                alone = await client.get("/sessions/huge")
                if alone.status_code == 200:
                    break
                await trio.sleep(0.01)
            assert alone.status_code == 200 and len(alone.content) > 250_000
        async with create_remote_store(server.url, retries=6) as remote:
            mid = await remote.load("mid")
            assert mid is not None and len(mid.turns) == 4  # the budget is free again
    finally:
        server.stop()


# -- 4. bad bodies are 4xx, and 4xx are final -----------------------------------


def _nested(depth: int) -> bytes:
    return b'{"id": "s1", "createdAt": 1, "updatedAt": 1, "metadata": {"a": ' + (
        b"[" * depth + b"]" * depth + b"}}"
    )


async def test_deeply_nested_json_is_a_client_error(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=JSON) as client:
        for depth in (600, 1_000, 5_000, 100_000):
            r = await client.put("/sessions/s1", content=_nested(depth))
            assert r.status_code in (400, 422), (depth, r.text)
        # Brackets inside strings are text, not nesting.
        text = b'{"id": "s1", "createdAt": 1, "updatedAt": 1, "metadata": {"a": "' + b"[" * 5_000
        r = await client.put("/sessions/s1", content=text + b'"}}')
        assert r.status_code == 204, r.text
        assert (await client.get("/sessions/s1")).json()["metadata"]["a"] == "[" * 5_000


async def test_a_refused_value_under_a_lone_surrogate_key_is_located_not_a_crash(
    server: ServerProcess,
) -> None:
    # JSON may escape a lone surrogate (JavaScript writes them); the located error's path
    # shows such a key escaped, so the answer is a 422 like any other refused value.
    deep = b"[" * 130 + b"]" * 130
    body = b'{"id": "s1", "createdAt": 1, "updatedAt": 1, "metadata": {"k\\ud800": ' + deep
    async with httpx.AsyncClient(base_url=server.url, headers=JSON) as client:
        r = await client.put("/sessions/s1", content=body + b"}}")
        assert r.status_code == 422, r.text
        assert r.json()["error"]["path"].startswith('$.metadata["k\\ud800"]')
        assert (await client.get("/sessions/s1")).status_code == 404


async def test_query_values_that_are_not_utf8_read_as_replacement_characters(
    server: ServerProcess,
) -> None:
    # A lone surrogate's UTF-8 bytes are kept (a filter for such an agent id matches none);
    # bytes that are no UTF-8 at all are U+FFFD, never a 500.
    async with httpx.AsyncClient(base_url=server.url) as client:
        for query in (
            "agentId=%FF",
            "agentId=%C3",
            "agentId=%ED%A0%80",
            "projectRoot=%FF%00",
            "agent=%FF&q=%C3%28",
        ):
            for path in ("/sessions", "/session-meta", "/session-search", "/ui/fragments/sessions"):
                r = await client.get(f"{path}?{query}")
                assert r.status_code == 200, (path, query, r.text)


async def test_remote_store_does_not_retry_a_rejected_body(server: ServerProcess) -> None:
    nested: object = []
    for _ in range(600):
        nested = [nested]
    data = SessionData(id="s1", created_at=1, updated_at=1, metadata={"a": nested})
    async with create_remote_store(server.url, retries=3) as remote:
        with pytest.raises(ValidationError):
            await remote.save(data)
        assert remote.statistics().requests <= 1  # refused by the client or the server, once


async def _answering(status: int, seen: list[bytes], task_status: trio.TaskStatus[int]) -> None:
    """A minimal HTTP server on 127.0.0.1 answering every request with ``status``."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            request = await stream.receive_some(65536)
            seen.append(request)
            body = b'{"error": {"code": "x", "message": "no"}}'
            await stream.send_all(
                f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                f"retry-after: 0\r\nconnection: close\r\n"
                f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


@pytest.mark.parametrize("status", [400, 404, 409, 413, 422, 429])
async def test_remote_store_never_retries_a_4xx(status: int) -> None:
    seen: list[bytes] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_answering, status, seen)
        async with create_remote_store(f"http://127.0.0.1:{port}", retries=3) as remote:
            with pytest.raises(Exception) as caught:
                await remote.list()
            assert not isinstance(caught.value, StoreUnavailableError)
            assert remote.statistics().requests == 1
        nursery.cancel_scope.cancel()
    assert len(seen) == 1


async def test_a_client_leaving_mid_body_is_one_quiet_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="zidane_actors.server")
    logged = trio.Event()

    class Signal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.set()

    logging.getLogger("zidane_actors.server").addHandler(signal := Signal())
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve(create_memory_store(), port=0, task_status=task_status)
        )
        port = int(url.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            f"PUT /sessions/s1 HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            "content-type: application/json\r\ncontent-length: 1000\r\n\r\n{".encode()
        )
        await stream.aclose()

        with trio.fail_after(10):
            await logged.wait()
        async with httpx.AsyncClient(base_url=url) as client:  # the server lives on
            assert (await client.get("/sessions")).json() == {"ids": []}
        nursery.cancel_scope.cancel()
    logging.getLogger("zidane_actors.server").removeHandler(signal)
    records = [r for r in caplog.records if r.name.startswith("zidane_actors.server")]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].levelno <= logging.INFO
    assert records[0].exc_info is None
    assert "left" in records[0].getMessage()


# -- 6. appends through the store actor --------------------------------------


async def test_concurrent_remote_writes_share_commits(tmp_path: Path) -> None:
    """50 clients writing at once: the server's store actor commits their writes together."""
    clients, writes = 50, 4
    async with open_sqlite_store(tmp_path / "s.db") as store, trio.open_nursery() as nursery:
        url = await nursery.start(lambda task_status: serve(store, port=0, task_status=task_status))
        remotes = [create_remote_store(url) for _ in range(clients)]
        for i, remote in enumerate(remotes):
            await remote.save(SessionData(id=f"c{i}", created_at=1, updated_at=1))
        before = store.statistics().transactions

        async def writer(i: int) -> None:
            for n in range(writes):  # plain writes: the server reads nothing for them
                await remotes[i].patch_meta(f"c{i}", {"n": n})

        async with trio.open_nursery() as writers:
            for i in range(clients):
                writers.start_soon(writer, i)
        commits = store.statistics().transactions - before
        for i, remote in enumerate(remotes):
            stored = await remote.load(f"c{i}")
            assert stored is not None and stored.metadata == {"n": writes - 1}
            await remote.aclose()
        nursery.cancel_scope.cancel()
    # Writes queued together went to the store as one transaction (group commit).
    assert commits < clients * writes, commits


# -- 5. the document is exact ---------------------------------------------------


async def test_what_the_document_allows_is_accepted(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=JSON) as client:
        # JSON Schema's integer includes 2.0; JavaScript cannot tell it from 2.
        body = b'{"id": "s1", "createdAt": 5.0, "updatedAt": 7.0, "metadata": {"f": 1.0}}'
        assert (await client.put("/sessions/s1", content=body)).status_code == 204
        stored = (await client.get("/sessions/s1")).json()
        assert (stored["createdAt"], stored["updatedAt"]) == (5, 7)
        assert stored["metadata"] == {"f": 1.0}  # free-form values are kept as sent
        assert b'"f":1.0' in (await client.get("/sessions/s1")).content
        r = await client.put("/sessions/s1", content=body.replace(b"5.0", b"5.5"))
        assert (r.status_code, r.json()["error"]["path"]) == (422, "$.createdAt")
        # Filters are a conjunction: a project and "untagged only" match nothing.
        r = await client.get("/sessions", params={"projectRoot": "/p", "untaggedOnly": "true"})
        assert r.json() == {"ids": []}
        # A body naming another resource than the URL is a conflict (RFC 9110, PUT).
        r = await client.put("/sessions/s2", content=body)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "id_mismatch")
        # 405 says what is allowed.
        r = await client.post("/sessions/s1")
        assert r.status_code == 405
        assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "PUT", "DELETE"}
        # Every status an operation answers is in the document.
        doc = (await client.get("/openapi.json")).json()
        append = doc["paths"]["/sessions/{sessionId}/turns"]["post"]["responses"]
        assert {"400", "404", "408", "409", "413", "415", "422", "503"} <= set(append)


def test_limits_must_be_positive() -> None:
    for name in ("max_body_bytes", "max_requests", "body_timeout_s", "max_body_bytes_in_flight"):
        with pytest.raises(ValidationError, match=name):
            ServerLimits(**{name: 0})
