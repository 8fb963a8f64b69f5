"""Issue 11, the values half: what every store (memory, SQLite, file map, remote over a real
server process, PostgreSQL) refuses, bounds and writes, through one mechanism in ``model/``.

- values JSON cannot carry exactly, and nesting past ``MAX_JSON_DEPTH``, are refused with a
  located ``ValidationError`` on every write path (never a ``RecursionError``);
- artifact limits hold on every write path (``normalize_artifact``);
- every id argument of every method is validated (``InvalidNameError``);
- persisted JSON always has the spec's required fields;
- the file-map adapter's spec shape, a foreign SQLite file, a row holding two documents.
"""

from __future__ import annotations

import datetime
import decimal
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET
from test_postgres_store import DSN, admin, fresh_schema
from test_server_e2e import ServerProcess

from zidane_actors import create_session
from zidane_actors.actors import set_extension_session_state
from zidane_actors.errors import (
    CorruptDataError,
    ExtensionStateError,
    InvalidNameError,
    StoreError,
    ValidationError,
)
from zidane_actors.model import (
    ARTIFACT_LABEL_MAX_CHARS,
    ARTIFACT_META_MAX_BYTES,
    ARTIFACT_URI_MAX_CHARS,
    MAX_JSON_DEPTH,
    MAX_STORED_JSON_DEPTH,
    AppendTurnsOptions,
    ArtifactFilter,
    ExtraFields,
    FileBlock,
    ImageBlock,
    ReasoningBlock,
    RunUserWait,
    Schedule,
    ScheduleFire,
    SessionArtifact,
    SessionArtifactInput,
    SessionData,
    SessionHistory,
    SessionRun,
    SessionTurn,
    StoredRunBehavior,
    StoredRunOptions,
    TextBlock,
    ToolCallBlock,
    TurnUsage,
    check_json,
    decode,
    encode,
    normalize_artifact_input,
    stored_too_deep,
)
from zidane_actors.model._checked import checked_turns
from zidane_actors.server._openapi import openapi_document
from zidane_actors.stores import (
    create_file_map_store,
    create_remote_store,
    open_directory_adapter,
    open_memory_store,
    open_postgres_store,
    open_sqlite_store,
    store_capabilities,
)
from zidane_actors.stores._validate import encoded
from zidane_actors.wire import PairingDrop, from_openai, to_openai

STORES = ("memory", "sqlite", "file_map", "remote", "postgres")
_SERVER: list[ServerProcess] = []


@pytest.fixture(scope="module", autouse=True)
def server() -> Iterator[ServerProcess]:
    """One memory-backed ``zidane-actors serve`` process for the module."""
    process = ServerProcess("memory")
    process.start()
    _SERVER.append(process)
    yield process
    _SERVER.clear()
    process.stop()


_JSON = {"content-type": "application/json"}  # the server's bodies (no-token mode)


async def _wipe(url: str) -> None:
    async with create_remote_store(url) as store:
        for sid in {*await store.list(), "s1", "s2"}:
            await store.delete(sid)
        for schedule in await store.list_schedules():
            await store.delete_schedule(schedule.id)


@asynccontextmanager
async def open_store(kind: str, tmp: Path) -> AsyncIterator[Any]:
    """A store of ``kind`` on fresh, empty storage."""
    if kind == "memory":
        async with open_memory_store() as store:
            yield store
    elif kind == "sqlite":
        async with open_sqlite_store(tmp / "sessions.db", durability="off") as store:
            yield store
    elif kind == "file_map":
        async with open_directory_adapter(tmp / "map") as adapter:
            yield create_file_map_store(adapter)
    elif kind == "remote":
        url = _SERVER[0].url
        await _wipe(url)
        async with create_remote_store(url) as store:
            yield store
    else:
        with fresh_schema() as schema:
            async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
                yield store


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    async with open_store(request.param, tmp_path) as opened:
        yield opened


# -- builders ----------------------------------------------------------------------------------


def nest(levels: int) -> Any:
    """``levels`` nested lists (``nest(1) == []``), built without recursion."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def turn(n: int, **fields: Any) -> SessionTurn:
    fields.setdefault("content", (TextBlock(f"turn {n}"),))
    fields.setdefault("role", "user")
    return SessionTurn(id=f"t{n}", created_at=1_000 + n, **fields)


def session(sid: str = "s1", **fields: Any) -> SessionData:
    return SessionData(id=sid, created_at=1_000, updated_at=2_000, **fields)


def artifact(aid: str = "a1", **fields: Any) -> SessionArtifact:
    fields.setdefault("uri", f"https://example.com/pr/{aid}")
    fields.setdefault("label", f"artifact {aid}")
    fields.setdefault("kind", "pull_request")
    return SessionArtifact(id=aid, session_id="s1", created_at=1_000, updated_at=1_000, **fields)


def caps(store: Any) -> frozenset[str]:
    return store_capabilities(store)


# -- items 6 and 7: exact JSON, bounded depth ----------------------------------------------------

BAD_VALUES: dict[str, Any] = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "bytes": b"\x00\xff",
    "bytearray": bytearray(b"x"),
    "memoryview": memoryview(b"x"),
    "int-key": {1: "x"},
    "tuple-key": {(1, 2): "x"},
    "set": {"a", "b"},
    "frozenset": frozenset({1}),
    "datetime": datetime.datetime(2026, 1, 1),
    "decimal": decimal.Decimal("1.5"),
    "struct": TextBlock("a model value is not free-form JSON"),
    "unset": UNSET,
    "past-max-depth": nest(MAX_JSON_DEPTH),  # inside {"k": {"v": ...}}: far past the limit
    "deep-2000": nest(2_000),
    "deep-100000": nest(100_000),
}

WritePath = Callable[[Any, Any], Awaitable[object]]


def _write_paths(store: Any) -> dict[str, tuple[WritePath, str]]:
    """Every write of a free-form value: ``(write(store, value), where the value lands)``."""
    bad: Callable[[Any], dict[str, Any]] = lambda value: {"k": {"v": value}}  # noqa: E731
    paths: dict[str, tuple[WritePath, str]] = {
        "save.metadata": (lambda s, v: s.save(session(metadata=bad(v))), ".metadata.k.v"),
        "save.turn.metadata": (
            lambda s, v: s.save(session(turns=(turn(1, metadata=bad(v)),))),
            ".turns[0].metadata.k.v",
        ),
        "append.tool_input": (
            lambda s, v: s.append_turns(
                "s1", [turn(2, content=(ToolCallBlock(id="c", name="n", input=bad(v)),))]
            ),
            "[0].content[0].input.k.v",
        ),
        "update_run.retry": (
            lambda s, v: s.update_run(
                "s1",
                SessionRun(
                    id="r1",
                    prompt="p",
                    started_at=1,
                    status="running",
                    options=StoredRunOptions(behavior=StoredRunBehavior(retry=bad(v))),
                ),
            ),
            ".options.behavior.retry.k.v",
        ),
    }
    if "save_meta" in caps(store):
        paths["save_meta.metadata"] = (
            lambda s, v: s.save_meta(session(metadata=bad(v))),
            ".metadata.k.v",
        )
    if "patch_meta" in caps(store):
        paths["patch_meta"] = (lambda s, v: s.patch_meta("s1", bad(v)), ".k.v")
    if "settle_send_request" in caps(store):
        paths["settle_send_request"] = (
            lambda s, v: s.settle_send_request("s1", "q1", bad(v)),
            ".k.v",
        )
    if "upsert_artifact" in caps(store):
        paths["upsert_artifact.meta"] = (
            lambda s, v: s.upsert_artifact(artifact(meta=bad(v))),
            ".meta.k.v",
        )
    return paths


async def _snapshot(store: Any) -> tuple[object, ...]:
    """What the store holds for s1, to prove a refused write changed nothing."""
    parts: list[object] = [await store.load("s1")]
    if "find_send_request" in caps(store):
        parts.append(await store.find_send_request("s1", "q1"))
    if "list_artifacts" in caps(store):
        parts.append(await store.list_artifacts(ArtifactFilter(session_id="s1")))
    return tuple(parts)


async def _seed(store: Any) -> None:
    await store.save(session(turns=(turn(0),), metadata={"title": "kept"}))
    if "claim_send_request" in caps(store):
        await store.claim_send_request("s1", "q1", "fp")


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=25,
)
KEYS = st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), min_size=1, max_size=6)


@given(value=JSON_VALUES)
def test_json_values_are_accepted_and_read_back_equal(value: Any) -> None:
    check_json(value)
    assert msgspec.json.decode(encode(value)) == value


@given(value=JSON_VALUES, keys=KEYS, bad=st.sampled_from(sorted(BAD_VALUES)))
def test_a_bad_leaf_is_refused_at_its_exact_path(value: Any, keys: list[str], bad: str) -> None:
    document: Any = BAD_VALUES[bad]
    for key in reversed(keys):
        document = {key: document}
    document = {"other": value, **document} if keys[0] != "other" else document
    with pytest.raises(ValidationError) as caught:
        check_json(document, path="$.metadata", depth=0)
    path = "$.metadata." + ".".join(keys)
    assert caught.value.path is not None and caught.value.path.startswith(path)
    if not bad.startswith(("past", "deep", "int-key", "tuple-key")):
        assert caught.value.path == path


_EXAMPLE = iter(range(10**9))


@pytest.mark.parametrize("kind", STORES)
@settings(
    max_examples=10,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=JSON_VALUES)
async def test_accepted_values_read_back_equal_in_every_store(
    kind: str, tmp_path: Path, value: Any
) -> None:
    """What a store acknowledges reads back exactly, in metadata, a tool input and a result."""
    storage = tmp_path / str(next(_EXAMPLE))
    storage.mkdir()
    call = ToolCallBlock(id="c", name="n", input={"v": value})
    data = session(metadata={"v": value}, turns=(turn(1, content=(call,), metadata={"v": value}),))
    async with open_store(kind, storage) as store:
        await store.save(data)
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.metadata == {"v": value} and loaded.turns == data.turns
        if "settle_send_request" in caps(store):
            await store.claim_send_request("s1", "q", "fp")
            await store.settle_send_request("s1", "q", {"v": value})
            record = await store.find_send_request("s1", "q")
            assert record is not None and record.result == {"v": value}


async def test_non_json_values_are_refused_on_every_write_path(store: Any) -> None:
    await _seed(store)
    before = await _snapshot(store)
    for name, (write, where) in _write_paths(store).items():
        for label, value in BAD_VALUES.items():
            with pytest.raises(ValidationError) as caught:
                await write(store, value)
            assert caught.value.path is not None, (name, label)
            assert where in caught.value.path, (name, label, caught.value.path)
    assert await _snapshot(store) == before


async def test_typed_fields_refuse_what_json_alters(store: Any) -> None:
    """A NaN cost would read back null and bytes text would read back as base64."""
    await _seed(store)
    before = await _snapshot(store)
    cases: list[tuple[SessionTurn, str]] = [
        (turn(5, usage=TurnUsage(input=1, output=1, cost=float("nan"))), "[0].usage.cost"),
        (turn(6, content=(TextBlock(b"bytes"),)), "[0].content[0].text"),  # type: ignore[arg-type]
        (
            turn(
                7,
                content=[TextBlock("a list where a tuple is typed, with a set")],
                metadata={"s": {1}},
            ),
            "[0].metadata.s",
        ),
    ]
    for bad_turn, where in cases:
        with pytest.raises(ValidationError) as caught:
            await store.append_turns("s1", [bad_turn])
        assert caught.value.path is not None and caught.value.path.endswith(where)
    assert await _snapshot(store) == before


async def test_depth_limit_is_exact_and_values_read_back_equal(store: Any) -> None:
    deepest = {"k": nest(MAX_JSON_DEPTH - 1)}  # the metadata object is level 1
    values = {"deep": deepest["k"], "big": 2**60, "text": "ünï 🎉\x00", "neg0": -0.0, "f": 1.5}
    await store.save(session(metadata=values, turns=(turn(1, metadata=deepest),)))
    loaded = await store.load("s1")
    assert loaded is not None
    assert loaded.metadata == values and loaded.turns[0].metadata == deepest
    with pytest.raises(ValidationError, match="MAX_JSON_DEPTH"):
        await store.save(session(metadata={"k": nest(MAX_JSON_DEPTH)}))


async def test_tuples_in_free_form_values_read_back_as_lists(store: Any) -> None:
    """The one documented normalisation: JSON has one array type."""
    await store.save(session(metadata={"pair": (1, (2, 3))}))
    loaded = await store.load("s1")
    assert loaded is not None and loaded.metadata == {"pair": [1, [2, 3]]}


async def test_session_api_refuses_bad_values_without_recursion_error() -> None:
    deep = {"x": nest(5_000)}
    for store_kind in ("none", "memory"):
        async with open_memory_store() as memory:
            backing = memory if store_kind == "memory" else None
            with pytest.raises(ValidationError) as caught:
                await create_session(store=backing, id="s1", metadata=deep)
            assert caught.value.path is not None and caught.value.path.startswith("$.metadata.x")
            s = await create_session(store=backing, id="s1")
            call = ToolCallBlock(id="c", name="n", input={"x": float("nan")})
            with pytest.raises(ValidationError) as caught:
                await s.append_turns([turn(0), turn(1, content=(call,))])
            assert caught.value.path == "$.turns[1].content[0].input.x"
            with pytest.raises(ValidationError) as caught:
                await s.append_turns(
                    [turn(1, content=(ToolCallBlock(id="c", name="n", input=deep),))]
                )
            with pytest.raises(ValidationError) as caught:
                await s.set_meta("title", {"when": datetime.date(2026, 1, 1)})
            assert caught.value.path == "$.metadata.title.when"
            with pytest.raises(ValidationError):
                await s.set_meta("deep", deep)
            with pytest.raises(ExtensionStateError):
                await set_extension_session_state(s, "ext", "key", {"tags": {"a"}})
            with pytest.raises(ValidationError):
                await s.add_artifact(
                    SessionArtifactInput(kind="file", uri="u", label="l", meta={1: 2})
                )
            with pytest.raises(ValidationError):
                await s.start_run("r1", label=b"x")  # type: ignore[arg-type]
            assert s.turns == () and s.metadata == {} and s.runs == ()
            if backing is not None:
                stored = await backing.load("s1")
                assert stored is not None and stored.turns == () and stored.metadata == {}


async def test_server_answers_422_for_deep_bodies() -> None:
    """Through the REST routes themselves (not the client's own check)."""
    url = _SERVER[0].url
    await _wipe(url)
    deep_json = "[" * 5_000 + "]" * 5_000
    async with httpx.AsyncClient(base_url=url, headers=_JSON) as client:
        answer = await client.put("/sessions/s1", content=encode(session()))
        assert answer.status_code == 204
        turn_json = encode(turn(1)).decode()
        for body in (
            f'{{"turns":[{turn_json[:-1]},"metadata":{{"x":{deep_json}}}}}]}}',
            '{"turns":['
            + turn_json[:-1]
            + ',"metadata":{"x":'
            + encode(nest(200)).decode()
            + "}}]}",
        ):
            answer = await client.post("/sessions/s1/turns", content=body)
            assert answer.status_code == 422, answer.text
        answer = await client.put(
            "/sessions/s1/send-requests/q/result", content=b'{"result":' + deep_json.encode() + b"}"
        )
        assert answer.status_code == 422, answer.text
        assert (await client.get("/session-meta")).status_code == 200
        assert (await client.get("/sessions/s1")).json()["turns"] == []


# -- item 5: artifact limits on every write path --------------------------------------------


async def test_artifact_limits_on_upsert(store: Any) -> None:
    if "upsert_artifact" not in caps(store):
        pytest.skip("no artifacts in this store")
    await store.save(session())
    huge = {"blob": "x" * (ARTIFACT_META_MAX_BYTES + 1)}
    stored = await store.upsert_artifact(artifact(meta=huge, label="L" * 600))
    assert stored is not None and stored.meta is UNSET  # meta dropped, artifact kept
    assert stored.label == "L" * 600  # kept as given: only a producer's label is clipped
    (listed,) = await store.list_artifacts(ArtifactFilter(session_id="s1"))
    assert listed == stored
    fits = {"blob": "x" * 100}
    assert (await store.upsert_artifact(artifact(meta=fits))).meta == fits
    with pytest.raises(ValidationError) as caught:
        await store.upsert_artifact(artifact("a2", uri="u" * (ARTIFACT_URI_MAX_CHARS + 1)))
    assert caught.value.path == "$.uri"
    with pytest.raises(ValidationError) as caught:
        await store.upsert_artifact(artifact("a3", kind="k" * 65))
    assert caught.value.path == "$.kind"
    assert len(await store.list_artifacts(ArtifactFilter(session_id="s1"))) == 1


async def test_session_add_artifact_applies_the_limits() -> None:
    async with open_memory_store() as memory:
        s = await create_session(store=memory, id="s1")
        big = {"blob": "x" * (ARTIFACT_META_MAX_BYTES + 1)}
        stored = await s.add_artifact(
            SessionArtifactInput(kind="file", uri="f", label="l", meta=big)
        )
        assert stored is not None and stored.meta is UNSET
        (listed,) = await memory.list_artifacts()
        assert listed.meta is UNSET
        long = await s.add_artifact(SessionArtifactInput(kind="file", uri="g", label="L" * 600))
        assert long is not None and len(long.label) == ARTIFACT_LABEL_MAX_CHARS
        assert long.label.endswith("…")
        with pytest.raises(ValidationError):
            await s.add_artifact(SessionArtifactInput(kind="file", uri="f" * 5_000, label="l"))


async def test_rest_artifact_route_applies_the_limits() -> None:
    url = _SERVER[0].url
    await _wipe(url)
    big = artifact(meta={"blob": "x" * (ARTIFACT_META_MAX_BYTES + 1)}, label="L" * 600)
    async with httpx.AsyncClient(base_url=url, headers=_JSON) as client:
        await client.put("/sessions/s1", content=encode(session()))
        answer = await client.put("/sessions/s1/artifacts", content=encode(big))
        assert answer.status_code == 200, answer.text
        stored = answer.json()["artifact"]
        assert "meta" not in stored and stored["label"] == "L" * 600
        too_long = artifact("a2", uri="u" * (ARTIFACT_URI_MAX_CHARS + 1))
        answer = await client.put("/sessions/s1/artifacts", content=encode(too_long))
        assert answer.status_code == 422 and answer.json()["error"]["path"] == "$.uri"


def test_normalize_artifact_input_drops_inexact_meta() -> None:
    raw = {"kind": "file", "uri": "f", "label": "l", "meta": {"n": float("nan")}}
    normalized = normalize_artifact_input(raw)
    assert normalized is not None and normalized.meta is UNSET


# -- item 4: every id argument of every method -----------------------------------------------

BAD = "../x"


def _id_calls(store: Any) -> dict[str, Callable[[], Awaitable[object]]]:
    s = store
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "load": lambda: s.load(BAD),
        "save.id": lambda: s.save(session(BAD)),
        "save.turn_id": lambda: s.save(session(turns=(msgspec.structs.replace(turn(1), id=BAD),))),
        "save.run_id": lambda: s.save(
            session(runs=(SessionRun(id=BAD, prompt="", started_at=1, status="completed"),))
        ),
        "append_turns.session": lambda: s.append_turns(BAD, [turn(1)]),
        "append_turns.turn": lambda: s.append_turns(
            "s1", [msgspec.structs.replace(turn(1), id=BAD)]
        ),
        "get_turns": lambda: s.get_turns(BAD),
        "update_run.session": lambda: s.update_run(
            BAD, SessionRun(id="r", prompt="", started_at=1, status="running")
        ),
        "update_run.run": lambda: s.update_run(
            "s1", SessionRun(id=BAD, prompt="", started_at=1, status="running")
        ),
        "append_turns.options_run": lambda: s.append_turns(
            "s1",
            [turn(1)],
            AppendTurnsOptions(run=SessionRun(id=BAD, prompt="", started_at=1, status="running")),
        ),
        "update_status": lambda: s.update_status(BAD, "idle"),
        "delete": lambda: s.delete(BAD),
    }
    optional: dict[str, dict[str, Callable[[], Awaitable[object]]]] = {
        "save_meta": {
            "save_meta.id": lambda: s.save_meta(session(BAD)),
            "save_meta.run_id": lambda: s.save_meta(
                session(runs=(SessionRun(id=BAD, prompt="", started_at=1, status="completed"),))
            ),
        },
        "get_meta": {"get_meta": lambda: s.get_meta(BAD)},
        "patch_meta": {"patch_meta": lambda: s.patch_meta(BAD, {"a": 1})},
        "claim_run": {"claim_run": lambda: s.claim_run(BAD, stale_at=0)},
        "mutate_history": {
            "mutate_history.session": lambda: s.mutate_history(BAD, lambda h: None),
            "mutate_history.turn_id": lambda: s.mutate_history(
                "s1",
                lambda h: SessionHistory(
                    turns=(msgspec.structs.replace(turn(1), id=BAD),), runs=h.runs
                ),
            ),
        },
        "mutate_turns": {"mutate_turns": lambda: s.mutate_turns(BAD, lambda t: None)},
        "claim_send_request": {
            "claim_send_request.session": lambda: s.claim_send_request(BAD, "q", "fp"),
            "claim_send_request.request": lambda: s.claim_send_request("s1", "", "fp"),
        },
        "find_send_request": {
            "find_send_request.session": lambda: s.find_send_request(BAD, "q"),
            "find_send_request.request": lambda: s.find_send_request("s1", "x\x00"),
        },
        "settle_send_request": {
            "settle_send_request.session": lambda: s.settle_send_request(BAD, "q", 1),
            "settle_send_request.request": lambda: s.settle_send_request("s1", 7, 1),
        },
        "upsert_artifact": {
            "upsert_artifact.id": lambda: s.upsert_artifact(artifact(BAD)),
            "upsert_artifact.session": lambda: s.upsert_artifact(
                msgspec.structs.replace(artifact(), session_id=BAD)
            ),
        },
        "delete_artifact": {
            "delete_artifact.session": lambda: s.delete_artifact(BAD, "a1"),
            "delete_artifact.artifact": lambda: s.delete_artifact("s1", BAD),
        },
        "list_artifacts": {
            "list_artifacts.session": lambda: s.list_artifacts(ArtifactFilter(session_id=BAD))
        },
        "save_schedule": {
            "save_schedule": lambda: s.save_schedule(
                Schedule(id=BAD, prompt="p", enabled=True, created_at=1, updated_at=1)
            )
        },
        "claim_schedule_fire": {"claim_schedule_fire": lambda: s.claim_schedule_fire(BAD, 1, 2)},
        "record_schedule_fire": {
            "record_schedule_fire.fire": lambda: s.record_schedule_fire(
                ScheduleFire(id=BAD, schedule_id="x", due_at=1, fired_at=1, status="ok")
            ),
            "record_schedule_fire.schedule": lambda: s.record_schedule_fire(
                ScheduleFire(id="f", schedule_id=BAD, due_at=1, fired_at=1, status="ok")
            ),
        },
        "list_schedule_fires": {"list_schedule_fires": lambda: s.list_schedule_fires(BAD, 5)},
        "delete_schedule": {"delete_schedule": lambda: s.delete_schedule(BAD)},
    }
    for capability, entries in optional.items():
        if capability in caps(store):
            calls.update(entries)
    if callable(getattr(store, "run_epoch", None)):
        calls["run_epoch"] = lambda: s.run_epoch(BAD)
    return calls


@pytest.mark.filterwarnings("ignore:mutate_turns is deprecated:DeprecationWarning")
async def test_every_id_argument_is_validated(store: Any) -> None:
    await store.save(session())
    before = await store.load("s1")
    missed = []
    for name, call in _id_calls(store).items():
        try:
            await call()
        except InvalidNameError:
            continue
        missed.append(name)
    assert missed == []
    assert await store.load("s1") == before


# -- item 8: required fields always written --------------------------------------------------


def test_required_fields_are_always_written() -> None:
    doc = msgspec.json.decode(encode(SessionData(id="s", created_at=1, updated_at=2)))
    assert doc == {
        "id": "s",
        "createdAt": 1,
        "updatedAt": 2,
        "status": "idle",
        "metadata": {},
        "turns": [],
        "runs": [],
    }
    assert msgspec.json.decode(encode(TurnUsage())) == {"input": 0, "output": 0}
    # Documents written before (without those fields) still decode.
    old = decode(b'{"id":"s","createdAt":1,"updatedAt":2}', SessionData)
    assert (old.status, old.metadata, old.turns, old.runs) == ("idle", {}, (), ())


def test_openapi_lists_the_fields_the_spec_requires() -> None:
    """``SessionData``'s ``status``, ``metadata``, ``turns`` and ``runs`` are required in the
    spec and always written; a reader still fills them in, so msgspec alone would list them
    as optional. The OpenAPI document lists them (and ``TurnUsage``'s ``input``/``output``)."""
    schemas = openapi_document(frozenset({"save_meta"}))["components"]["schemas"]
    assert schemas["SessionData"]["required"] == [
        "id",
        "createdAt",
        "updatedAt",
        "status",
        "metadata",
        "turns",
        "runs",
    ]
    assert schemas["TurnUsage"]["required"] == ["input", "output"]
    assert "agentId" not in schemas["SessionData"]["required"]


def test_fields_a_document_leaves_out_stay_out() -> None:
    """A call without ``input``, reasoning without ``text``: read as written."""
    call = b'{"type":"tool_call","id":"c","name":"n"}'
    assert encode(decode(call, ToolCallBlock)) == call
    reasoning = b'{"type":"reasoning","signature":"s"}'
    assert encode(decode(reasoning, ReasoningBlock)) == reasoning


def test_run_user_wait_requires_ms() -> None:
    """The spec requires ``userWait.ms``: refused when built, decoded or described without it."""
    with pytest.raises(TypeError, match="ms"):
        RunUserWait(since=5)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="`ms`") as caught:
        decode(b'{"since":5}', RunUserWait)
    assert caught.value.path == "$"
    run = b'{"id":"r1","prompt":"p","startedAt":1,"status":"completed","userWait":{"since":5}}'
    with pytest.raises(ValidationError, match="`ms`") as caught:
        decode(run, SessionRun)
    assert caught.value.path == "$.userWait"
    assert decode(b'{"ms":0,"since":5}', RunUserWait) == RunUserWait(ms=0, since=5)
    schema = openapi_document(frozenset())["components"]["schemas"]["RunUserWait"]
    assert schema["required"] == ["ms"]


def test_pairing_drop_is_camel_case_without_null_call_id() -> None:
    assert msgspec.json.decode(encode(PairingDrop(3, "empty-turn"))) == {
        "index": 3,
        "kind": "empty-turn",
    }
    assert msgspec.json.decode(encode(PairingDrop(1, "orphan-tool-result", "c1")))["callId"] == "c1"


async def test_rest_answers_carry_the_required_fields(store: Any) -> None:
    """``load`` of every store, and the REST answer, carry turns/runs/status/metadata."""
    await store.save(session())
    loaded = await store.load("s1")
    assert loaded is not None
    doc = msgspec.json.decode(encode(loaded))
    assert {"status", "metadata", "turns", "runs"} <= doc.keys()
    url = _SERVER[0].url
    async with httpx.AsyncClient(base_url=url, headers=_JSON) as client:
        await client.put("/sessions/s9", content=encode(session("s9")))
        answer = (await client.get("/sessions/s9")).json()
        await client.delete("/sessions/s9")
    assert {"status": "idle", "metadata": {}, "turns": [], "runs": []}.items() <= answer.items()


# -- item 9 -----------------------------------------------------------------------------------


class SpecShapedAdapter:
    """A ``FileMapAdapter`` written to the spec: ``get`` answers ``{"files": {...}}``."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    async def get(self) -> dict[str, dict[str, str]]:
        await trio.lowlevel.checkpoint()
        return {"files": dict(self.files)}

    async def save(self, files: dict[str, str]) -> None:
        await trio.lowlevel.checkpoint()
        self.files = dict(files)

    async def delete(self) -> None:
        await trio.lowlevel.checkpoint()
        self.files = {}


async def test_file_map_adapter_in_the_spec_shape() -> None:
    adapter = SpecShapedAdapter()
    store = create_file_map_store(adapter)
    data = session(turns=(turn(0),), metadata={"title": "t"})
    await store.save(data)
    await store.append_turns("s1", [turn(1)])
    loaded = await store.load("s1")
    assert loaded is not None and [t.id for t in loaded.turns] == ["t0", "t1"]
    assert loaded.metadata == {"title": "t"}
    adapter.files["turns.jsonl"] = 5  # type: ignore[assignment]
    with pytest.raises(CorruptDataError):
        await store.load("s1")


async def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    with pytest.raises(StoreError, match="not migrated"):
        async with open_sqlite_store(path):
            pass
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert tables == {"notes"}
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0


@pytest.mark.parametrize("user_version", [0, 1, 3, 5])
async def test_foreign_sqlite_file_is_refused_untouched(tmp_path: Path, user_version: int) -> None:
    """Refused by reading it only: no WAL switch, no migration, same bytes, a clear message."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute(f"PRAGMA user_version = {user_version}")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="belongs to another program"):
        async with open_sqlite_store(path):
            pass
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["other.db"]


async def test_sqlite_rows_holding_two_documents_or_deep_json_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with open_sqlite_store(path) as store:
        await store.save(session(turns=(turn(0), turn(1))))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE turns SET body = CAST(body || ',' || body AS BLOB) WHERE seq = 0")
    async with open_sqlite_store(path) as store:
        for read in (store.load("s1"), store.get_turns("s1")):
            with pytest.raises(CorruptDataError):
                await read
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM turns")
        deep = "[" * 5_000 + "]" * 5_000
        conn.execute("UPDATE sessions SET metadata = ?", (f'{{"x":{deep}}}',))
    async with open_sqlite_store(path) as store:
        with pytest.raises(CorruptDataError):
            await store.load("s1")
        with pytest.raises(CorruptDataError):
            await store.get_meta("s1")


async def test_postgres_rows_holding_two_documents_or_deep_json_are_corrupt() -> None:
    with fresh_schema() as schema:
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
            await store.save(session(turns=(turn(0), turn(1))))
            await trio.to_thread.run_sync(
                admin, schema, "UPDATE turns SET body = body || ',' || body WHERE seq = 0"
            )
            for read in (store.load("s1"), store.get_turns("s1")):
                with pytest.raises(CorruptDataError):
                    await read
            with pytest.raises(CorruptDataError):
                await store.mutate_history("s1", lambda h: None)
            deep = "[" * 5_000 + "]" * 5_000
            await trio.to_thread.run_sync(admin, schema, "DELETE FROM turns")
            await trio.to_thread.run_sync(
                admin, schema, "UPDATE sessions SET metadata = %s", (f'{{"x":{deep}}}',)
            )
            with pytest.raises(CorruptDataError):
                await store.load("s1")


class PlainAdapter(SpecShapedAdapter):
    """A ``FileMapAdapter`` answering the plain ``{name: text}`` map."""

    async def get(self) -> dict[str, str]:  # type: ignore[override]
        await trio.lowlevel.checkpoint()
        return dict(self.files)


async def test_file_map_line_holding_two_documents_is_corrupt() -> None:
    adapter = PlainAdapter()
    store = create_file_map_store(adapter)
    await store.save(session(turns=(turn(0), turn(1))))
    first, second = adapter.files["turns.jsonl"].splitlines()
    adapter.files["turns.jsonl"] = f"{first} {second}\n{second}\n"
    with pytest.raises(CorruptDataError):
        await store.load("s1")
    adapter.files["turns.jsonl"] = f"{first}\n"
    meta = adapter.files["meta.json"]
    adapter.files["meta.json"] = meta[:-1] + ',"x":' + "[" * 5_000 + "]" * 5_000 + "}"
    with pytest.raises(CorruptDataError):
        await store.load("s1")


def test_decode_of_a_deep_document_is_a_validation_error() -> None:
    deep = b'{"id":"s","createdAt":1,"updatedAt":2,"metadata":{"x":' + b"[" * 5_000
    deep += b"]" * 5_000 + b"}}"
    with pytest.raises(ValidationError, match="MAX_JSON_DEPTH"):
        decode(deep, SessionData)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (float("nan"), "$"),
        (float("inf"), "$"),
        ({"a": [1, {"b": float("-inf")}]}, "$.a[1].b"),
        ({"kept": None, "x": float("nan")}, "$.x"),
        ({"text": "\ud800", "x": float("nan")}, "$.x"),  # the lone-surrogate encoding path
        (
            SessionTurn(
                id="t",
                role="assistant",
                content=(ToolCallBlock(id="c", name="f", input={"n": float("nan")}),),
                created_at=1,
            ),
            "$.content[0].input.n",
        ),
        (
            SessionTurn(
                id="t",
                role="user",
                content=(TextBlock("x", extra_fields=ExtraFields({"odd": float("inf")})),),
                created_at=1,
            ),
            "$.content[0].odd",
        ),
    ],
    ids=["nan", "inf", "nested", "beside-null", "surrogate", "turn", "extra-field"],
)
def test_encode_refuses_non_finite_numbers_located(value: Any, path: str) -> None:
    """msgspec writes NaN and infinities as ``null``, a different value on read: ``encode``
    refuses them where they are, as ``check_json`` does; a real ``null`` still encodes."""
    with pytest.raises(ValidationError, match="NaN and infinities are refused") as caught:
        encode(value)
    assert caught.value.path == path
    assert encode({"a": None, "b": [1.5, None]}) == b'{"a":null,"b":[1.5,null]}'


async def test_provider_tool_arguments_json_cannot_keep_stay_raw() -> None:
    """``NaN`` (which Python's json accepts) or nesting past the limit in a model's tool
    arguments keep the text verbatim, so the turn can still be stored and sent back."""
    for arguments in ('{"x": NaN}', '{"x":' + "[" * 300 + "]" * 300 + "}"):
        message = from_openai(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": arguments},
                    }
                ],
            }
        )
        (call,) = message.content
        assert isinstance(call, ToolCallBlock) and call.input == {"_raw": arguments}
        async with open_memory_store() as memory:
            await memory.save(session())
            await memory.append_turns("s1", [turn(1, role="assistant", content=message.content)])
        (wire,) = to_openai(message)
        assert wire["tool_calls"][0]["function"]["arguments"] == arguments


# -- unknown fields: kept as written (documents from a newer writer) --------------------------


@pytest.mark.parametrize(
    "doc",
    [
        b'{"id":"t","role":"user","content":[],"createdAt":1,"extra":2}',
        b'{"id":"t","role":"user","content":[{"type":"text","text":"x","y":1}],"createdAt":1}',
        b'{"id":"t","role":"user","content":[],"createdAt":1,"usage":{"input":1,"output":0,"z":0}}',
        b'{"id":"t","role":"user","content":[],"createdAt":1,"\\u007fextra":{"a":1}}',
    ],
)
def test_decode_keeps_an_unknown_field_where_it_was(doc: bytes) -> None:
    """A field the model has no place for is kept in ``extra_fields`` and written back."""
    value = decode(doc, SessionTurn)
    check_json(dict(value.extra_fields or {}))
    assert msgspec.json.decode(encode(value)) == msgspec.json.decode(doc)


def test_an_unknown_field_spelled_like_a_known_one_is_refused() -> None:
    clash = ExtraFields({"role": "user"})
    with pytest.raises(ValidationError, match="extra field `role`"):
        encoded(turn(1, extra_fields=clash), "turn")
    with pytest.raises(ValidationError, match="extra_fields must be an ExtraFields"):
        encoded(turn(1, extra_fields={"x": 1}), "turn")


def test_unknown_fields_of_options_and_filters_are_still_refused() -> None:
    """An option this version does not know could not be obeyed: refused at its path."""
    with pytest.raises(ValidationError, match=r"unknown field .*\(at \$\)"):
        decode(b'{"kind":"x","since":1,"newFilter":true}', ArtifactFilter)


async def test_server_keeps_documents_with_unknown_fields() -> None:
    """REST in and out: a turn, a run and a session with fields of a newer writer."""
    url = _SERVER[0].url
    await _wipe(url)
    async with httpx.AsyncClient(base_url=url, headers=_JSON) as client:
        doc = msgspec.json.decode(encode(session()))
        doc["workspace"] = {"root": "/w"}
        assert (await client.put("/sessions/s1", json=doc)).status_code == 204
        turn_doc = msgspec.json.decode(encode(turn(1)))
        turn_doc["parentTurnId"] = "t0"
        turn_doc["content"][0]["citations"] = [{"n": 1}]
        answer = await client.post("/sessions/s1/turns", json={"turns": [turn_doc]})
        assert answer.status_code == 204, answer.text
        run_doc = {"id": "r1", "prompt": "p", "startedAt": 1, "status": "running", "budget": 1}
        answer = await client.put("/sessions/s1/runs/r1", json={"run": run_doc})
        assert answer.status_code in (200, 204), answer.text
        stored = (await client.get("/sessions/s1")).json()
    assert stored["workspace"] == {"root": "/w"}
    assert stored["turns"] == [turn_doc]
    assert stored["runs"] == [run_doc]


async def test_server_carries_lone_surrogates_in_and_out() -> None:
    """JavaScript's ``JSON.stringify`` writes a clipped emoji as ``"\\ud83d"``: kept, not a 400."""
    url = _SERVER[0].url
    await _wipe(url)
    async with httpx.AsyncClient(base_url=url, headers=_JSON) as client:
        body = encode(session()).replace(b'"metadata":{}', b'"metadata":{"t":"a\\ud83d"}')
        assert b"\\ud83d" in body
        answer = await client.put("/sessions/s1", content=body)
        assert answer.status_code == 204, answer.text
        turn_json = encode(turn(1)).replace(b'"turn 1"', b'"cut \\ud83d"')
        answer = await client.post("/sessions/s1/turns", content=b'{"turns":[' + turn_json + b"]}")
        assert answer.status_code == 204, answer.text
        raw = (await client.get("/sessions/s1")).content
    assert b'"a\\ud83d"' in raw and b'"cut \\ud83d"' in raw
    loaded = decode(raw, SessionData)
    assert loaded.metadata == {"t": "a\ud83d"}
    assert loaded.turns[0].content == (TextBlock("cut \ud83d"),)


async def test_stored_documents_with_unknown_fields_read_back(tmp_path: Path) -> None:
    """A row or a line another writer wrote with a field this version does not know."""
    path = tmp_path / "s.db"
    async with open_sqlite_store(path) as store:
        await store.save(session(turns=(turn(0),)))
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE turns SET body = CAST(substr(CAST(body AS TEXT), 1, length(body) - 1)"
            " || ',\"futureField\":1}' AS BLOB)"
        )
    async with open_sqlite_store(path) as store:
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.turns[0].extra_fields == {"futureField": 1}
        await store.append_turns("s1", [turn(1)])
        await store.save(loaded)
        again = await store.load("s1")
        assert again is not None and again.turns[0].extra_fields == {"futureField": 1}
    adapter = PlainAdapter()
    file_store = create_file_map_store(adapter)
    await file_store.save(session(turns=(turn(0), turn(1))))
    first, second = adapter.files["turns.jsonl"].splitlines()
    adapter.files["turns.jsonl"] = f'{first[:-1]},"futureField":1}}\n{second}\n'
    loaded = await file_store.load("s1")
    assert loaded is not None and loaded.turns[0].extra_fields == {"futureField": 1}


async def test_plainly_wrong_calls_raise_library_errors(store: Any) -> None:
    """A wrong argument is a ValidationError, never a TypeError or a UnicodeEncodeError."""
    await store.save(session())
    for call in (
        lambda: store.get_turns("s1", None),
        lambda: store.get_turns("s1", "x"),
        lambda: store.get_turns("s1", 0, "x"),
        lambda: store.update_status("s1", {"a": 1}),
    ):
        with pytest.raises(ValidationError):
            await call()


async def test_session_calls_with_lone_surrogates_or_wrong_types() -> None:
    async with open_memory_store() as memory:
        s = await create_session(store=memory, id="s1")
        await s.set_meta("k", "\ud800")
        await s.save()
        stored = await memory.load("s1")
        assert stored is not None and stored.metadata == {"k": "\ud800"}
        for bad in (None, 5, "turns", {"t": 1}):
            with pytest.raises(ValidationError):
                await s.append_turns(bad)  # type: ignore[arg-type]
    assert decode(encode("\ud800"), str) == "\ud800"
    assert encode({"k": "a\udc00b"}) == b'{"k":"a\\udc00b"}'


_WRONG_TURNS: list[tuple[dict[str, Any], str]] = [
    ({"content": None}, "$.turns[0].content"),
    ({"content": 5}, "$.turns[0].content"),
    ({"content": (TextBlock(None),)}, "$.turns[0].content[0].text"),  # type: ignore[arg-type]
    ({"id": ["unhashable"]}, "$.turns[0].id"),
    ({"role": "bogus"}, "$.turns[0].role"),
    ({"created_at": "now"}, "$.turns[0].createdAt"),
    ({"usage": 5}, "$.turns[0].usage"),
]


@pytest.mark.parametrize(("fields", "path"), _WRONG_TURNS, ids=[p for _, p in _WRONG_TURNS])
async def test_a_turn_built_with_a_wrong_type_is_refused_located(
    fields: dict[str, Any], path: str
) -> None:
    """msgspec does not check types on construction: ``SessionTurn(content=None)`` builds.
    Appending one raises a located ``ValidationError`` (a ``TypeError`` came from deep in
    the checks before), and nothing is written; a dict standing for a block still reads
    back as its block."""
    base: dict[str, Any] = {"id": "t1", "role": "user", "content": (TextBlock("x"),)}
    wrong = SessionTurn(**{"created_at": 1, **base, **fields})
    with pytest.raises(ValidationError) as direct:
        checked_turns([wrong])
    assert direct.value.path == path
    async with open_memory_store() as memory:
        s = await create_session(store=memory, id="s1")
        with pytest.raises(ValidationError) as caught:
            await s.append_turns([wrong])
        assert caught.value.path == path
        assert s.turns == () and await memory.get_turns("s1") == []
        as_dict = SessionTurn(
            id="t2", role="user", content=({"type": "text", "text": "y"},), created_at=2
        )  # type: ignore[arg-type]
        await s.append_turns([as_dict])
        assert [t.content for t in await memory.get_turns("s1")] == [(TextBlock("y"),)]


def test_model_invariants_raise_the_library_error() -> None:
    with pytest.raises(ValidationError, match="exactly one of"):
        ImageBlock(data="aGk=", url="https://x", media_type="image/png")
    with pytest.raises(ValidationError, match="mediaType"):
        FileBlock(data="aGk=")


def test_stored_too_deep_counts_brackets_outside_strings_only() -> None:
    """The rule a store reads a row by: nesting past MAX_STORED_JSON_DEPTH is corrupt."""
    at = "[" * MAX_STORED_JSON_DEPTH + "]" * MAX_STORED_JSON_DEPTH
    assert not stored_too_deep(at) and not stored_too_deep(at.encode())
    assert stored_too_deep(f"[{at}]") and stored_too_deep(f'{{"x":[{at}]}}'.encode())
    assert not stored_too_deep('["' + "[{" * 1_000 + '"]')  # brackets in a string
    assert not stored_too_deep('["\\"' + "[" * 1_000 + '"]')  # after an escaped quote
    assert not stored_too_deep("[" * 1_000)  # not JSON: decoding says so
    deepest_write = SessionData(id="s", created_at=1, updated_at=1, metadata={"k": nest(127)})
    assert not stored_too_deep(encode(deepest_write))
