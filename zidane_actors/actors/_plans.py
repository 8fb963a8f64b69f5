"""A session's store writes planned from memory: each one a write and the memory change its
acknowledgement makes, applied by the actor or by the store actor's verdict.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec

from ..errors import (
    ConflictError,
    StaleSessionError,
    ValidationError,
)
from ..model import (
    SaveMetaOptions,
    SessionArtifact,
    SessionArtifactInput,
    SessionRun,
    SessionStatus,
    UpdateRunOptions,
    check_model,
    current_run_owner,
    new_id,
    normalize_artifact,
    preview,
    upsert_runs,
)
from ..model._artifacts import clip_artifact_label
from ..stores._protocol import (
    Revision,
    StoreWrite,
)
from ._commands import _FinishRun, _Plan, _total_usage
from ._view import _View

T = TypeVar("T")


class _Planned(_View):
    """Plans of the writes a session makes from memory (see ``_commands._StoreCommand``)."""

    __slots__ = ()

    def _store_call(self, write: StoreWrite) -> Awaitable[Any]:
        """Make ``write`` as a call of the store (the actor's path)."""
        method: Callable[..., Awaitable[Any]] = getattr(self._store, write.method)
        return method(*write.args, **write.kwargs)

    def _store_write(self, method: str, *args: Any) -> StoreWrite | None:
        return None if self._store is None else StoreWrite(method, args)

    def _save_plan(self, keys: tuple[str, ...] | None) -> _Plan[bool]:
        """A save (``keys`` ``None``) or ``save_meta_keys``; answers whether it was a full save.

        ``save_meta`` with the keys changed since the last save, unless the
        history was replaced (a bulk save) or the store has no ``save_meta``.
        """
        data = self._snapshot()
        expect = {} if self._rev is None else {"expected_rev": self._rev}
        sent = data.runs
        if "save_meta" in self._caps and (keys is not None or not self._bulk):
            saved = tuple(sorted(self._changed)) if keys is None else keys
            # The header and the runs the store may lack: it never writes turns here.
            sent = self._unsent_runs(data.runs)
            header = msgspec.structs.replace(data, turns=(), runs=sent)
            write = StoreWrite("save_meta", (header, SaveMetaOptions(meta_keys=saved)), expect)
            full = False
        else:
            if self._bulk and self._rev is not None and self._edit_epoch != self._epoch:
                raise StaleSessionError(
                    f"session {self.id!r}: the history given to set_turns/set_runs was read "
                    "before another writer's change reached this session",
                    expected=None,
                    actual=self._rev,
                )
            saved = self._changed
            write = StoreWrite("save", (data,), expect)
            full = True
        fields = self._fields

        def finish(result: object) -> bool:
            if type(result) is Revision and self._rev is not None:
                self._rev = result.after
                if full:
                    self._known_runs = data.runs
                elif sent and self._known_runs is not None:
                    self._known_runs = upsert_runs(self._known_runs, sent)
            self._changed = tuple(k for k in self._changed if k not in saved)
            self._fields = tuple(f for f in self._fields if f not in fields)
            if full:
                self._bulk = False
                self._pre = None
            return full

        return write, finish

    def _run_plan(self, run: SessionRun, options: UpdateRunOptions | None, answer: T) -> _Plan[T]:
        """Upsert ``run`` through ``store.update_run``, then in memory; answer ``answer``."""

        def finish(result: object) -> T:
            data = self._data
            runs = upsert_runs(data.runs, (run,))
            self._acknowledge_runs(data.runs, runs, (run,))
            if self._pre is not None:
                self._pre = (self._pre[0], upsert_runs(self._pre[1], (run,)))
            self._commit(msgspec.structs.replace(data, runs=runs, updated_at=self._now()))
            self._observe(result)
            return answer

        return self._store_write("update_run", self.id, run, options), finish

    def _start_run_plan(
        self, run_id: str, prompt: str, extras: Mapping[str, Any]
    ) -> _Plan[SessionRun]:
        if any(r.id == run_id for r in self._data.runs):
            raise ConflictError(f"session {self.id!r} already has a run {run_id!r}")
        run = SessionRun(
            id=run_id, prompt=prompt, started_at=self._now(), status="running", **extras
        )
        check_model(run, what="run", path="$.run")
        return self._run_plan(run, None, run)

    def _finish_run_plan(self, command: _FinishRun) -> _Plan[SessionRun]:
        current = next((r for r in self._data.runs if r.id == command.run_id), None)
        if current is None:
            raise ValidationError(
                f"session {self.id!r} has no run {preview(command.run_id)}", path="$.runId"
            )
        changes: dict[str, Any] = {"status": command.status, "ended_at": self._now()}
        if command.stats is not None:
            stats = command.stats
            changes.update(
                tokens_in=stats.tokens_in,
                tokens_out=stats.tokens_out,
                turns=stats.turns,
                total_usage=_total_usage(stats),
            )
            if stats.cost is not None:
                changes["cost"] = stats.cost
            if stats.turn_usage is not None:
                changes["turn_usage"] = stats.turn_usage
        if command.error is not None:
            changes["error"] = command.error
        if command.detail is not None:
            changes["error_detail"] = command.detail
        run = msgspec.structs.replace(current, **changes)
        check_model(run, what="run", path="$.run")
        return self._run_plan(run, None, run)

    def _status_plan(self, status: SessionStatus) -> _Plan[None]:
        def finish(result: object) -> None:
            owner = current_run_owner() if status == "running" else None
            if self._held is not None:
                self._held = self._held.settled()
            self._commit(
                msgspec.structs.replace(
                    self._data, status=status, run_owner=owner, updated_at=self._now()
                )
            )
            self._observe(result)

        return self._store_write("update_status", self.id, status), finish

    def _artifact_plan(
        self, input: SessionArtifactInput, run_id: str | None, turn_id: str | None
    ) -> _Plan[SessionArtifact | None]:
        now = self._now()
        artifact = SessionArtifact(
            id=new_id(),
            session_id=self.id,
            kind=input.kind,
            uri=input.uri,
            label=clip_artifact_label(input.label),
            created_at=now,
            updated_at=now,
            meta=input.meta,
            project_root=input.project_root or self._data.project_root,
            run_id=run_id,
            turn_id=turn_id,
        )
        write = self._store_write("upsert_artifact", normalize_artifact(artifact))
        return write, self._stored_artifact

    def _stored_artifact(self, result: SessionArtifact | None) -> SessionArtifact | None:
        # The upsert moved the rev by a step its answer does not say: fold before relying on it.
        if self._rev is not None:
            self._stale = True
            self._own_step = True
        return result
