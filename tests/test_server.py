"""The REST app: routes, errors, limits, auth and capabilities (hypercorn on 127.0.0.1)."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from zidane_actors.errors import UnsupportedOperationError
from zidane_actors.model import (
    AppendTurnsOptions,
    RunOwner,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionRun,
    SessionStatus,
    SessionTurn,
    UpdateRunOptions,
    encode,
)
from zidane_actors.server import ServerLimits, create_app, serve, served_capabilities
from zidane_actors.stores import MemoryStore, SessionStore, create_memory_store, create_remote_store
from zidane_actors.stores.remote import history_rev


class RequiredOnly:
    """A store with only the required methods (over a memory store): the 501 paths."""

    def __init__(self) -> None:
        self._inner = create_memory_store()

    async def load(self, session_id: str) -> SessionData | None:
        return await self._inner.load(session_id)

    async def save(self, data: SessionData) -> None:
        await self._inner.save(data)

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> None:
        await self._inner.append_turns(session_id, turns, options)

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        return await self._inner.get_turns(session_id, from_, limit)

    async def update_run(
        self, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> None:
        await self._inner.update_run(session_id, run, options)

    async def update_status(
        self,
        session_id: str,
        status: SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> None:
        await self._inner.update_status(
            session_id, status, owner=owner, preserve_updated_at=preserve_updated_at
        )

    async def delete(self, session_id: str) -> None:
        await self._inner.delete(session_id)

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        return await self._inner.list(filter)


JSON = {"content-type": "application/json"}


@asynccontextmanager
async def running(store: SessionStore, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """``serve(store)`` on a free loopback port, and a client on it."""
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve(store, port=0, task_status=task_status, **options)
        )
        async with httpx.AsyncClient(base_url=url, headers=JSON) as client:
            yield client
        nursery.cancel_scope.cancel()


def turn(n: int) -> dict[str, Any]:
    return {
        "id": f"t{n}",
        "role": "user",
        "content": [{"type": "text", "text": f"m{n}"}],
        "createdAt": n,
    }


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    detail: dict[str, Any] = body["error"]
    return detail


SESSION = {"id": "s1", "createdAt": 1, "updatedAt": 1}


async def test_routes_round_trip() -> None:
    async with running(create_memory_store()) as c:
        assert (await c.put("/sessions/s1", json=SESSION)).status_code == 204
        r = await c.post("/sessions/s1/turns", json={"turns": [turn(1), turn(2)]})
        assert r.status_code == 204
        r = await c.get("/sessions/s1/turns", params={"from": "1", "limit": "5"})
        assert [t["id"] for t in r.json()] == ["t2"]
        run = {"id": "r1", "prompt": "p", "startedAt": 1, "status": "running"}
        assert (await c.put("/sessions/s1/runs/r1", json={"run": run})).status_code == 204
        status = {"status": "completed"}
        assert (await c.put("/sessions/s1/status", json=status)).status_code == 204
        patch = {"set": {"title": "hello"}, "remove": ["gone"]}
        assert (await c.patch("/sessions/s1/meta", json=patch)).status_code == 204
        meta = (await c.get("/sessions/s1/meta")).json()
        assert (meta["turnCount"], meta["runCount"], meta["metadata"]) == (2, 1, {"title": "hello"})
        r = await c.get("/session-meta", params={"untaggedOnly": "true"})
        assert [row["id"] for row in r.json()] == ["s1"]
        r = await c.get("/sessions", params={"projectRoot": "/elsewhere"})
        assert r.json() == {"ids": []}
        assert (await c.delete("/sessions/s1")).status_code == 204
        assert error_of(await c.get("/sessions/s1"))["code"] == "session_not_found"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("PUT", "/sessions/s1", b'{"id": "s1",', 400, "invalid_json"),
        (
            "PUT",
            "/sessions/s1",
            b'{"id": "s2", "createdAt": 1, "updatedAt": 1}',
            409,
            "id_mismatch",
        ),
        (
            "PUT",
            "/sessions/s1",
            b'{"id": "s1", "createdAt": -1, "updatedAt": 1}',
            422,
            "invalid_body",
        ),
        ("GET", "/sessions/.hidden", None, 400, "invalid_name"),
        ("GET", "/sessions/a%20b", None, 400, "invalid_name"),
        ("GET", "/sessions/s1/turns?from=x", None, 400, "invalid_query"),
        ("GET", "/sessions/s1/turns?limit=-1", None, 400, "invalid_query"),
        ("GET", "/sessions?untaggedOnly=maybe", None, 400, "invalid_query"),
        ("GET", "/nowhere", None, 404, "not_found"),
        ("POST", "/sessions/s1", b"{}", 405, "method_not_allowed"),
        # The write routes matched ahead of the router match exactly what the router would.
        ("POST", "/sessions/a/b/turns", b'{"turns": []}', 404, "not_found"),
        ("POST", "/sessions//turns", b'{"turns": []}', 404, "not_found"),
        ("POST", "/sessions/.x/turns", b'{"turns": []}', 400, "invalid_name"),
        ("POST", "/sessions/ghost/turns", b'{"turns": [{"id": "t"}]}', 422, "invalid_body"),
        ("GET", "/writes", None, 405, "method_not_allowed"),
        ("POST", "/writes", b'{"writes": [{"op": "nope"}]}', 422, "invalid_body"),
        ("POST", "/writes", b"[", 400, "invalid_json"),
        (
            "PATCH",
            "/sessions/s1/meta",
            b'{"set": {"a": 1}, "remove": ["a"]}',
            409,
            "conflicting_patch",
        ),
        ("PATCH", "/sessions/s1/meta", b'{"set": 1}', 422, "invalid_body"),
        (
            "POST",
            "/sessions/s1/turns",
            b'{"turns": [{"id": "t", "role": "robot"}]}',
            422,
            "invalid_body",
        ),
    ],
)
async def test_bad_requests_get_json_errors(
    method: str, path: str, body: bytes | None, status: int, code: str
) -> None:
    async with running(create_memory_store()) as c:
        r = await c.request(method, path, content=body)
        assert r.status_code == status, r.text
        detail = error_of(r)
        assert detail["code"] == code
        assert detail["message"]


async def test_body_errors_locate_the_field() -> None:
    async with running(create_memory_store()) as c:
        bad = {"turns": [turn(1), {**turn(2), "content": [{"type": "txt"}]}]}
        detail = error_of(await c.post("/sessions/s1/turns", json=bad))
        assert detail["path"] == "$.turns[1].content[0].type"


async def test_oversized_bodies_are_refused() -> None:
    async with running(create_memory_store(), limits=ServerLimits(max_body_bytes=1_000)) as c:
        big = {**SESSION, "metadata": {"x": "y" * 2_000}}
        r = await c.put("/sessions/s1", json=big)
        assert (r.status_code, error_of(r)["code"]) == (413, "body_too_large")

        async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted as it streams
            for _ in range(10):
                yield b" " * 500

        r = await c.put("/sessions/s1", content=chunks())
        assert r.status_code == 413
        # The server answered before reading the whole body and closes that connection.
        async with httpx.AsyncClient(base_url=c.base_url, headers=JSON) as fresh:
            assert (await fresh.get("/sessions/s1")).status_code == 404


async def test_token_auth() -> None:
    async with running(create_memory_store(), token="t0ken") as c:
        r = await c.get("/sessions")
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert (
            await c.get("/sessions", headers={"authorization": "Bearer t0ke"})
        ).status_code == 401
        assert (
            await c.get("/sessions", headers={"authorization": "Basic t0ken"})
        ).status_code == 401
        assert (
            await c.get("/sessions", headers={"authorization": "Bearer t0ken"})
        ).status_code == 200


@pytest.mark.parametrize("client", ["10.0.0.7", "192.168.1.2", "::ffff:8.8.8.8", "not-an-ip"])
async def test_without_token_only_loopback_clients(client: str) -> None:
    app = create_app(create_memory_store())
    transport = httpx.ASGITransport(app=app, client=(client, 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.get("/sessions")
        assert (r.status_code, error_of(r)["code"]) == (403, "forbidden")
    loopback = httpx.ASGITransport(app=app, client=("::1", 4000))
    async with httpx.AsyncClient(transport=loopback, base_url="http://127.0.0.1") as c:
        assert (await c.get("/sessions")).status_code == 200


async def test_token_admits_remote_clients() -> None:
    app = create_app(create_memory_store(), token="k")
    transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        assert (await c.get("/sessions", headers={"authorization": "Bearer k"})).status_code == 200


async def test_missing_capabilities_answer_501_and_leave_the_document() -> None:
    store = RequiredOnly()
    async with running(store) as c:
        r = await c.post("/sessions/s1/claim-run", json={"staleAt": 0})
        assert (r.status_code, error_of(r)["code"]) == (501, "unsupported")
        assert (await c.get("/schedules")).status_code == 501
        paths = (await c.get("/openapi.json")).json()["paths"]
        assert "/schedules" not in paths
        assert "/sessions/{sessionId}/history" in paths  # served over load + save
        remote = create_remote_store(str(c.base_url))
        async with remote:
            with pytest.raises(UnsupportedOperationError):
                await remote.list_schedules()
            # Ids and history edits are served even by a required-only store.
            assert await remote.generate_session_id()
            await remote.save(SessionData(id="s1", created_at=1, updated_at=1))
            await remote.append_turns(
                "s1", [SessionTurn(id="t1", role="user", content=(), created_at=1)]
            )
            with pytest.warns(DeprecationWarning, match="mutate_history"):
                assert await remote.mutate_turns("s1", lambda turns: ()) == "ok"
            assert await remote.get_turns("s1") == []
    assert served_capabilities(store) == {
        "fork_session",
        "generate_session_id",
        "generate_turn_id",
        "list_forks",
        "mutate_history",
        "mutate_turns",
    }


async def test_history_fallback_is_atomic_against_appends() -> None:
    async with running(RequiredOnly()) as c:
        await c.put("/sessions/s1", json={**SESSION, "turns": [turn(1)]})
        state = (await c.get("/sessions/s1/history")).json()
        await c.post("/sessions/s1/turns", json={"turns": [turn(2)]})
        r = await c.put(
            "/sessions/s1/history",
            json={"history": {"turns": [], "runs": []}, "expectedRev": state["rev"]},
        )
        assert (r.status_code, error_of(r)["code"]) == (409, "rev_mismatch")
        fresh = (await c.get("/sessions/s1/history")).json()
        r = await c.put(
            "/sessions/s1/history",
            json={"history": {"turns": [], "runs": []}, "expectedRev": fresh["rev"]},
        )
        assert r.json() == {"result": "ok", "rev": history_rev(SessionHistory(turns=(), runs=()))}
        r = await c.put(
            "/sessions/nope/history",
            json={"history": {"turns": [], "runs": []}, "expectedRev": "x"},
        )
        assert r.json() == {"result": "no-session"}


async def test_concurrent_duplicate_appends_store_one_copy() -> None:
    store = create_memory_store()
    async with running(store) as c:
        await c.put("/sessions/s1", json=SESSION)
        body = encode({"turns": [turn(1), turn(2)]})
        results: list[int] = []

        async def post() -> None:
            results.append((await c.post("/sessions/s1/turns", content=body)).status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(post)
        assert results == [204] * 5
        assert [t.id for t in await store.get_turns("s1")] == ["t1", "t2"]


async def test_openapi_document_resolves_every_reference() -> None:
    async with running(create_memory_store()) as c:
        doc = (await c.get("/openapi.json")).json()
    assert doc["openapi"] == "3.1.0"
    schemas = doc["components"]["schemas"]
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs
    for ref in refs:
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    put = doc["paths"]["/sessions/{sessionId}/turns"]["post"]
    assert put["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AppendTurnsBody"
    )


def test_create_app_checks_its_options() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app(MemoryStore(), limits=ServerLimits(max_body_bytes=0))
    with pytest.raises(ValueError, match="token"):
        create_app(MemoryStore(), token="")
