"""One simulated host for the multi-process PostgreSQL tests.

Run as ``python tests/_pg_worker.py DSN SCHEMA``: it opens the store (racing
the other hosts through the schema migration), prints ``{"ready": pid}``, then
answers one JSON line on stdout for each JSON command line on stdin:

- ``{"op": "claim_run", "session": id, "at": epoch_s}`` → ``{"claimed": bool}``
- ``{"op": "fire", "schedule": id, "due": ms, "next": ms, "at": epoch_s}`` → ``{"won": bool}``
- ``{"op": "append", "session": id, "worker": w, "count": n, "batch": b, "at": epoch_s}``
  appends ``n`` turns ``w{w}-{i}`` in batches of ``b``, each batch sent twice (a
  retried write) and carrying the turn ``shared-{k}`` every host also appends
  (with the same content);
  with ``"batched": true`` both copies go in one ``apply_writes`` batch;
  answers ``{"appended": n}``
- ``{"op": "extension_state", "session": id, "worker": w, "count": n, "at": epoch_s}``
  loads the session on a host over the store and sets the extension state
  ``("race", "w{w}-{i}")`` to ``i`` for each ``i < n``, one after another;
  answers ``{"set": n}``
- ``{"op": "quit"}`` closes the store and exits.

``at`` is a wall-clock start time shared by every host, so their calls race.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import trio

from zidane_actors.actors import open_session_host, set_extension_session_state
from zidane_actors.model import SessionTurn, TextBlock
from zidane_actors.stores import PostgresStore, StoreWrite, open_postgres_store


async def _start_at(at: float) -> None:
    await trio.sleep(max(0.0, at - time.time()))


def _turn(turn_id: str) -> SessionTurn:
    return SessionTurn(
        id=turn_id,
        role="user",
        content=(TextBlock(text=f"from pid {os.getpid()}"),),
        created_at=time.time_ns() // 1_000_000,
    )


def _shared(k: int) -> SessionTurn:
    return SessionTurn(
        id=f"shared-{k}", role="user", content=(TextBlock(text=f"shared {k}"),), created_at=k
    )


async def _handle(store: PostgresStore, cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "claim_run":
        await _start_at(cmd["at"])
        claim = await store.claim_run(cmd["session"], stale_at=0)
        return {"claimed": claim.claimed}
    if op == "fire":
        await _start_at(cmd["at"])
        return {"won": await store.claim_schedule_fire(cmd["schedule"], cmd["due"], cmd["next"])}
    if op == "append":
        await _start_at(cmd["at"])
        worker, count, batch = cmd["worker"], cmd["count"], cmd["batch"]
        for start in range(0, count, batch):
            turns = [_turn(f"w{worker}-{i}") for i in range(start, min(count, start + batch))]
            # Every host appends the same shared turn (identical content: a retry, not
            # a conflict, under the unique-turn-id rule).
            turns.append(_shared(start // batch))
            if cmd.get("batched"):
                write = StoreWrite("append_turns", (cmd["session"], turns))
                for result in await store.apply_writes([write, write]):
                    result.unwrap()
            else:
                await store.append_turns(cmd["session"], turns)
                await store.append_turns(cmd["session"], turns)
        return {"appended": count}
    if op == "extension_state":
        async with open_session_host(store) as host:
            held = await host.load_session(cmd["session"])
            assert held is not None
            await _start_at(cmd["at"])
            for i in range(cmd["count"]):
                await set_extension_session_state(held, "race", f"w{cmd['worker']}-{i}", i)
        return {"set": cmd["count"]}
    raise ValueError(f"unknown command {op!r}")


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def main(dsn: str, schema: str) -> None:
    async with open_postgres_store(dsn, schema=schema, pool_size=1) as store:
        _reply({"ready": os.getpid()})
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                return
            try:
                _reply(await _handle(store, cmd))
            except Exception as exc:
                _reply({"error": "; ".join(f"{type(e).__name__}: {e}" for e in _leaves(exc))})


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
