"""GenAI spans folded into run records, and the trio-side write of a record.

Reads the OpenTelemetry GenAI semantic-convention attributes only
(``gen_ai.operation.name``, ``gen_ai.agent.name``, ``gen_ai.request.model`` /
``gen_ai.response.model``, ``gen_ai.usage.*``, ``gen_ai.tool.name``,
``gen_ai.input.messages``), the span's status and its ``exception`` events:
no framework's own attribute names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs
import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from ..actors import Session, SessionHost
from ..errors import ConflictError, InvalidNameError
from ..model import (
    ExtraFields,
    RunErrorDetail,
    RunStatus,
    SessionRun,
    SessionRunAgent,
    StoredRunOptions,
    TurnUsage,
    preview,
    validate_id,
)
from ._shared import CallTime, name_agent, with_calls, with_trace
from ._usage import Price, cost_of, total

__all__ = ["OpenRun", "agent_of", "record_run", "run_id_of", "session_id_of"]

OPERATION: Final = "gen_ai.operation.name"
CONVERSATION: Final = "gen_ai.conversation.id"
AGENT: Final = "gen_ai.agent.name"
AGENT_CALL: Final = "gen_ai.agent.call.id"
"""A run's own id where the framework gives one (pydantic-ai's ``run_id``)."""

_MODEL_CALLS: Final = frozenset({"chat", "text_completion", "generate_content"})
_ERROR_LINE: Final = 500


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def session_id_of(value: object) -> str | None:
    """``value`` as a session id, or ``None`` when it cannot name one."""
    try:
        return validate_id(value)
    except InvalidNameError:
        return None


def agent_of(attributes: Mapping[str, Any]) -> str | None:
    """The agent a span names (``gen_ai.agent.name``)."""
    return _text(attributes.get(AGENT))


def run_id_of(attributes: Mapping[str, Any] | None, trace_id: int, span_id: int) -> str:
    """The framework's own run id when it gives a valid one, else one made of the span's ids."""
    own = (attributes or {}).get(AGENT_CALL)
    try:
        return validate_id(own, what="run id")
    except InvalidNameError:
        return f"otel-{trace_id:032x}-{span_id:016x}"


def _ms(ns: int | None) -> int | None:
    return None if ns is None else ns // 1_000_000


def _timed(span: ReadableSpan) -> tuple[int, float] | None:
    """An ended span's start (epoch ms) and length (ms)."""
    if span.start_time is None or span.end_time is None:
        return None
    return span.start_time // 1_000_000, max(0, span.end_time - span.start_time) / 1e6


def _usage(attributes: Mapping[str, Any], model: str | None) -> TurnUsage | None:
    tokens_in = _count(attributes.get("gen_ai.usage.input_tokens"))
    tokens_out = _count(attributes.get("gen_ai.usage.output_tokens"))
    if tokens_in is None and tokens_out is None:
        return None
    return TurnUsage(
        input=tokens_in or 0,
        output=tokens_out or 0,
        cache_read=_count(attributes.get("gen_ai.usage.cache_read.input_tokens")),
        cache_creation=_count(attributes.get("gen_ai.usage.cache_creation.input_tokens")),
        model=model,
    )


def _model(attributes: Mapping[str, Any]) -> str | None:
    return _text(attributes.get("gen_ai.response.model")) or _text(
        attributes.get("gen_ai.request.model")
    )


def _prompt(attributes: Mapping[str, Any]) -> str | None:
    """The text of the last user message a model call was sent (``gen_ai.input.messages``)."""
    raw = attributes.get("gen_ai.input.messages")
    if not isinstance(raw, str):
        return None
    try:
        messages = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            parts = message.get("parts")
            texts = [
                part.get("content")
                for part in (parts if isinstance(parts, list) else ())
                if isinstance(part, dict) and part.get("type") == "text"
            ]
            return "\n".join(t for t in texts if isinstance(t, str))
    return None


def _failure(span: ReadableSpan) -> tuple[str, RunErrorDetail] | None:
    """A failed span's one-line error (``Type: message``) and its full text, else ``None``."""
    if span.status.status_code is not StatusCode.ERROR:
        return None
    attributes = span.attributes or {}
    kind = _text(attributes.get("error.type"))
    message = _text(span.status.description)
    for event in span.events:
        if event.name == "exception":
            found = event.attributes or {}
            kind = _text(found.get("exception.type")) or kind
            message = _text(found.get("exception.message")) or message
    if message is not None and kind is not None and message.startswith(f"{kind}: "):
        message = message.removeprefix(f"{kind}: ")
    head = (message or "").split("\n", 1)[0][:_ERROR_LINE]
    line = f"{kind}: {head}" if kind and head else kind or head or "the span ended in error"
    status = _count(attributes.get("http.response.status_code"))
    return line, RunErrorDetail(message=message, status_code=status, code=kind)


@attrs.define(eq=False)
class OpenRun:
    """One run (the outermost GenAI span, or an ``invoke_agent`` span) as its spans end.

    Made in the application's thread at the span's start; its spans are
    folded in by the processor's worker thread only.
    """

    id: str
    span_id: int
    started_at: int
    session_id: str | None
    trace_id: int | None = None
    agent: str | None = None
    parent: OpenRun | None = None
    prompt: str | None = None
    usage: list[TurnUsage] = attrs.Factory(list)
    models: list[str] = attrs.Factory(list)
    failed_tool: tuple[str, RunErrorDetail] | None = None
    calls: list[CallTime] = attrs.Factory(list)  # its model and tool spans' own times

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1

    def fold(self, span: ReadableSpan, price: Price | None) -> None:
        """Take in what one ended span of this run shows (a model call, a tool call)."""
        attributes = span.attributes or {}
        self.session_id = self.session_id or session_id_of(attributes.get(CONVERSATION))
        self.agent = self.agent or agent_of(attributes)
        operation = attributes.get(OPERATION)
        timed = _timed(span)
        if operation in _MODEL_CALLS and timed is not None:
            name = _model(attributes) or str(operation)
            self.calls.append(CallTime("model", name, *timed, failed=_failure(span) is not None))
        if operation in _MODEL_CALLS or (span.context.span_id == self.span_id and not self.usage):
            model = _model(attributes)
            if model is not None:
                self.models.append(model)
            usage = _usage(attributes, model)
            if usage is not None:
                cost = cost_of(usage, price)
                if cost is not None:
                    usage = msgspec.structs.replace(usage, cost=cost)
                self.usage.append(usage)
            if self.prompt is None:
                self.prompt = _prompt(attributes)
        elif operation == "execute_tool":
            failure = _failure(span)
            tool = _text(attributes.get("gen_ai.tool.name"))
            if timed is not None:
                call_id = _text(attributes.get("gen_ai.tool.call.id"))
                failed = failure is not None
                self.calls.append(CallTime("tool", tool or "tool", *timed, call_id, failed))
            if failure is not None:
                line, detail = failure
                self.failed_tool = (f"{tool or 'a tool'}: {line}", detail)

    def record(self, status: RunStatus, span: ReadableSpan | None = None) -> SessionRun:
        """The run record as known now (``span``: the run's own span, ended)."""
        error = detail = None
        ended_at = None
        if span is not None:
            ended_at = _ms(span.end_time)
            failure = _failure(span)
            if failure is not None:
                status, (error, detail) = "error", failure
                if self.failed_tool is not None and detail.message is None:
                    error, detail = self.failed_tool
        usages = tuple(self.usage)
        summed = total(usages) if usages else None
        run = SessionRun(
            id=self.id,
            prompt=self.prompt or "",
            started_at=self.started_at,
            status=status,
            agent=None if self.agent is None else SessionRunAgent(id=self.agent, label=self.agent),
            cost=None if summed is None else summed.cost,
            depth=self.depth,
            ended_at=ended_at,
            error=error,
            error_detail=detail,
            options=StoredRunOptions(model=self.models[-1]) if self.models else None,
            parent_run_id=None if self.parent is None else self.parent.id,
            tokens_in=None if summed is None else summed.input,
            tokens_out=None if summed is None else summed.output,
            total_usage=summed,
            turns=len(usages) if span is not None else None,
            turn_usage=usages or None,
            wall_ms=None if ended_at is None else float(max(0, ended_at - self.started_at)),
        )
        run = with_calls(run, self.calls)
        if self.trace_id is None:
            return run
        return with_trace(
            run, {"traceId": f"{self.trace_id:032x}", "spanId": f"{self.span_id:016x}"}
        )


def _merged(stored: SessionRun, new: SessionRun) -> SessionRun:
    """``new``, keeping what ``stored`` (written by another door, say) has and ``new`` lacks."""
    kept = {
        name: getattr(stored, name)
        for name in SessionRun.__struct_fields__
        if getattr(new, name) is None and getattr(stored, name) is not None
    }
    if not new.prompt and stored.prompt:
        kept["prompt"] = stored.prompt
    if new.extra_fields and stored.extra_fields:
        kept["extra_fields"] = ExtraFields({**stored.extra_fields, **new.extra_fields})
    if new.status == "running" and stored.status != "running":
        return stored  # a start seen after the end: the end stands
    return msgspec.structs.replace(new, **kept) if kept else new


async def _session(host: SessionHost, session_id: str, agent: str | None) -> Session:
    for _ in range(3):
        session = await host.load_session(session_id)
        if session is not None:
            return session
        try:
            return await host.create_session(id=session_id, agent_id=agent)
        except ConflictError:
            continue  # created meanwhile, by this host or another writer: load it
    raise ConflictError(f"session {preview(session_id)} could not be created or loaded")


async def record_run(host: SessionHost, session_id: str, run: SessionRun) -> None:
    """Upsert ``run`` in the session (created when missing).

    A top-level run's agent names the session's agent when it has none.
    """
    agent = run.agent.id if run.agent is not None and not run.depth else None
    session = await _session(host, session_id, agent)
    # Memory as it is (read only; a run kept is written back through the session, checked).
    stored = next((r for r in session._memory().runs if r.id == run.id), None)
    await session.update_run(run if stored is None else _merged(stored, run))
    await name_agent(session, agent)
