"""The run records of openai-agents' Runner calls, for ``integrations.openai_agents``.

A ``RunnerCall`` is what one ``Runner`` call has shown the session so far
(known by its ``Usage`` object, which every item write and hook of the call
carries); its ``Run``s are the records it writes: one per agent, a
handoff's as a child run, each with the OpenTelemetry span it began in
(``traceContext``) and the times of its model and tool calls the hooks saw
(``callTimes``). ``Hooks`` is ``ZidaneSession.hooks``. ``Failures`` is the
tracing processor (installed with the first call a trace holds) that ends
a call's runs as its Runner's task span ends: with the exception it raised,
when it raised, with no ``with`` block or ``session.run`` needed.
"""

from __future__ import annotations

import collections
import contextvars
import sys
import threading
import time
import weakref
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import attrs
import msgspec
from agents import (
    Agent,
    FunctionTool,
    Handoff,
    ModelResponse,
    RunContextWrapper,
    RunHooks,
    Tool,
    default_tool_error_function,
)
from agents.tool import default_tool_timeout_error_message
from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    ResponseSpanData,
    Span,
    TaskSpanData,
    Trace,
    TracingProcessor,
    add_trace_processor,
    get_current_trace,
)
from agents.tracing.traces import NoOpTrace
from openai.types.responses import ResponseFunctionToolCall

from ..errors import ActorClosed
from ..model import (
    RunStatus,
    SessionRun,
    SessionRunAgent,
    StoredRunOptions,
    TextBlock,
    TurnUsage,
    new_id,
)
from ._responses import ItemGroup
from ._shared import CallTime, trace_context, with_calls, with_trace
from ._usage import cost_of, total

if TYPE_CHECKING:
    from .openai_agents import ZidaneSession

attempt: Final[contextvars.ContextVar[list[RunnerCall] | None]] = contextvars.ContextVar(
    "zidane_openai_agents_attempt", default=None
)
"""The calls a ``ZidaneSession.run``/``run_sync``/``run_streamed`` began (its context)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- runs -------------------------------------------------------------------------------


@attrs.define(eq=False)
class Run:
    """One agent's part of a Runner call, as it will be written."""

    id: str
    prompt: str
    started_at: int
    agent: str | None = None
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    depth: int | None = None
    model: str | None = None
    usage: list[TurnUsage] = attrs.Factory(list)
    turns: int = 0
    status: RunStatus = "running"
    ended_at: int | None = None
    error: str | None = None
    trace: dict[str, str] | None = attrs.Factory(trace_context)  # the span it began in
    calls: list[CallTime] = attrs.Factory(list)  # its model and tool calls, as the hooks timed them

    def record(self, tokens: tuple[int, int] | None = None) -> SessionRun:
        usages = tuple(self.usage)
        summed = total(usages) if usages else None
        tokens_in, tokens_out = (summed.input, summed.output) if summed else tokens or (None, None)
        run = SessionRun(
            id=self.id,
            prompt=self.prompt,
            started_at=self.started_at,
            status=self.status,
            agent=None if self.agent is None else SessionRunAgent(id=self.agent, label=self.agent),
            cost=None if summed is None else summed.cost,
            depth=self.depth,
            ended_at=self.ended_at,
            error=self.error,
            options=None if self.model is None else StoredRunOptions(model=self.model),
            parent_call_id=self.parent_call_id,
            parent_run_id=self.parent_run_id,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            total_usage=summed,
            turns=self.turns,
            turn_usage=usages or None,
            wall_ms=None if self.ended_at is None else float(self.ended_at - self.started_at),
        )
        return with_calls(with_trace(run, self.trace), self.calls)


@attrs.define(eq=False)
class RunnerCall:
    """What one ``Runner.run``/``run_sync``/``run_streamed`` call has shown so far."""

    runs: list[Run]
    tokens: tuple[int, int] = (0, 0)  # the call's cumulative tokens (known without hooks too)
    pending: collections.deque[tuple[Run, TurnUsage]] = attrs.Factory(collections.deque)
    calls: list[tuple[str, str]] = attrs.Factory(list)  # the last response's (name, call id)
    hooked: bool = False
    llm_open: int = 0
    tool_open: int = 0
    llm_started: list[int] = attrs.Factory(list)  # start times (ns) of model calls still open
    tool_started: dict[str, int] = attrs.Factory(dict)  # call id -> its start (ns)
    final: bool = False
    done: bool = False
    changed: set[str] = attrs.Factory(set)  # ids of runs to write besides the current one
    failed: set[str] = attrs.Factory(set)  # call ids of tool results reported as failed
    tool_errors: dict[str, str] = attrs.Factory(dict)  # call id -> the tool's exception text
    raised: str | None = None  # the exception the Runner raised, when the session saw it
    stored: bool = False  # this session stored an item of the call: its runs are this session's
    answered: bool = False  # its last stored item is an answer (an assistant message, no call)

    @property
    def current(self) -> Run:
        return self.runs[-1]

    def finish(self, status: RunStatus, error: str | None = None) -> None:
        now = now_ms()
        while self.pending:  # responses no stored item holds (the call ended first): billed
            run, usage = self.pending.popleft()
            run.usage.append(usage)
        for run in self.runs:
            if run.status == "running":
                run.status, run.ended_at, run.error = status, now, error
                self.changed.add(run.id)
        self.done = True

    def settle(self, error: str | None = None) -> None:
        """Close the runs of a call that is over (its context gone, its session closing).

        ``error`` is the exception that ended it, when known (the one the
        Runner raised first, when the session saw it). Without hooks, a call
        whose last stored item is not an answer has an unknown outcome: never
        recorded as completed.
        """
        error = self.raised or error
        if self.final or (not self.hooked and self.answered and error is None):
            self.finish("completed")
        elif self.llm_open:
            self.finish("error", error or "the model call did not answer (the Runner raised)")
        elif self.tool_open:
            self.finish("error", error or "a tool call did not finish (the Runner raised)")
        elif error is not None:
            self.finish("error", error)
        elif self.hooked:
            self.finish("aborted", "ended without a final output (interrupted or stopped)")
        else:
            self.finish("aborted", "ended without an answer (its outcome is unknown without hooks)")


Placed = tuple[Run, TurnUsage | None]
"""The run a turn belongs to, and the usage of the response it holds (assistant turns)."""


def model_name(agent: Agent[Any]) -> str | None:
    model = agent.model
    if isinstance(model, str):
        return model
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else None


def prompt_of(groups: list[ItemGroup]) -> str:
    for role, content, _ in groups:
        if role == "user":
            for block in content:
                if isinstance(block, TextBlock):
                    return block.text
    return ""


_TOOL_FAILED: Final = default_tool_error_function(RunContextWrapper(None), Exception())


def is_failure_text(tool: Tool, result: object) -> bool:
    """Whether ``result`` is the text openai-agents answers for a function tool that failed.

    Its default failure handler's message, or its timeout message: what the
    hooks alone can tell (``tool_error_formatter`` tells every reported failure).
    """
    if not isinstance(tool, FunctionTool) or not isinstance(result, str):
        return False
    if result == _TOOL_FAILED:
        return True
    timeout = tool.timeout_seconds
    return timeout is not None and result == default_tool_timeout_error_message(
        tool_name=tool.name, timeout_seconds=timeout
    )


class Hooks(RunHooks[Any]):
    """``ZidaneSession.hooks``: tells the session what the Runner does."""

    def __init__(self, session: ZidaneSession) -> None:
        self._session = weakref.ref(session)

    def _call(self, context: RunContextWrapper[Any]) -> RunnerCall | None:
        session = self._session()
        if session is None:
            return None
        call = session._runner_call(context.usage, "")
        call.hooked = True
        return call

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        call = self._call(context)
        if call is not None and call.current.agent is None:
            call.current.agent = agent.name
            call.current.model = model_name(agent)

    async def on_llm_start(self, context: Any, agent: Any, *_: Any) -> None:
        call = self._call(context)
        if call is not None:
            call.llm_open += 1
            call.llm_started.append(time.time_ns())

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        call, session = self._call(context), self._session()
        if call is None or session is None:
            return
        call.llm_open -= 1
        if call.llm_started:
            call.current.calls.append(
                timed("model", model_name(agent) or agent.name, call.llm_started.pop(0))
            )
        measured = response.usage
        cached = getattr(measured.input_tokens_details, "cached_tokens", 0) or None
        usage = TurnUsage(
            input=measured.input_tokens,
            output=measured.output_tokens,
            cache_read=cached,
            model=model_name(agent),
        )
        cost = cost_of(usage, session.price)
        if cost is not None:
            usage = msgspec.structs.replace(usage, cost=cost)
        call.pending.append((call.current, usage))
        call.calls = [
            (item.name, item.call_id)
            for item in response.output
            if isinstance(item, ResponseFunctionToolCall)
        ]

    async def on_tool_start(self, context: Any, agent: Any, tool: Tool) -> None:
        call = self._call(context)
        if call is not None:
            call.tool_open += 1
            call_id = getattr(context, "tool_call_id", None)
            if isinstance(call_id, str):
                call.tool_started[call_id] = time.time_ns()

    async def on_tool_end(self, context: Any, agent: Any, tool: Tool, result: object) -> None:
        call = self._call(context)
        if call is None:
            return
        call.tool_open -= 1
        call_id = getattr(context, "tool_call_id", None)
        if not isinstance(call_id, str):
            return
        failed = is_failure_text(tool, result) or call_id in call.tool_errors
        if failed:
            call.failed.add(call_id)
        started = call.tool_started.pop(call_id, None)
        if started is not None:
            call.current.calls.append(timed("tool", tool.name, started, call_id, failed=failed))

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        call = self._call(context)
        if call is None:
            return
        parent = call.current
        tool = Handoff.default_tool_name(to_agent)
        call_id = next((cid for name, cid in call.calls if name == tool), None)
        call.runs.append(
            Run(
                id=new_id(),
                prompt=parent.prompt,
                started_at=now_ms(),
                agent=to_agent.name,
                parent_run_id=parent.id,
                parent_call_id=call_id,
                depth=(parent.depth or 0) + 1,
                model=model_name(to_agent),
            )
        )
        call.changed.add(parent.id)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        call = self._call(context)
        if call is not None:
            call.final = True


def timed(
    kind: str, name: str, started_ns: int, call_id: str | None = None, *, failed: bool = False
) -> CallTime:
    """A call that began at ``started_ns`` (``time.time_ns``) and ends now."""
    took = (time.time_ns() - started_ns) / 1e6
    return CallTime(kind, name, started_ns // 1_000_000, took, call_id, failed)


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# -- the tracing processor --------------------------------------------------------


class Failures(TracingProcessor):
    """Ends a Runner call's runs when its task span ends (the SDK's tracing, when on).

    A span ending while an exception propagates sees it (``sys.exc_info``):
    the call failed, with that exception's type and text, at that moment.
    A task span ending without one is a call that returned: completed.
    Calls are known by the trace they began in (``traced``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, list[tuple[RunnerCall, weakref.ref[ZidaneSession]]]] = {}
        self._agent_errors: dict[str, str] = {}  # trace id -> the agent span's error text

    def traced(self, session: ZidaneSession, call: RunnerCall) -> None:
        """Follow ``call`` when the current trace is a real one."""
        trace = get_current_trace()
        if trace is None or isinstance(trace, NoOpTrace):
            return
        with self._lock:
            self._calls.setdefault(trace.trace_id, []).append((call, weakref.ref(session)))

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            self._calls.pop(trace.trace_id, None)
            self._agent_errors.pop(trace.trace_id, None)

    def on_span_start(self, span: Span[Any]) -> None:
        self._name(span)

    def _name(self, span: Span[Any]) -> None:
        """Without hooks, an agent span names the agent (at its start or end: a streamed
        call stores its first item after the span began)."""
        data = span.span_data
        if not isinstance(data, AgentSpanData):
            return
        with self._lock:
            calls = list(self._calls.get(span.trace_id, ()))
        for call, _ in calls:
            if call.current.agent is None:
                call.current.agent = data.name

    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        raised = sys.exc_info()[1]
        if isinstance(data, FunctionSpanData | GenerationSpanData | ResponseSpanData):
            self._timed(span)
            return
        self._name(span)
        if isinstance(data, AgentSpanData) and span.error is not None:
            detail = (span.error.get("data") or {}).get("error")
            text = f"{span.error.get('message')}: {detail}" if detail else span.error["message"]
            with self._lock:
                self._agent_errors.setdefault(span.trace_id, text)
        if not isinstance(data, TaskSpanData):
            return
        with self._lock:
            calls = self._calls.pop(span.trace_id, [])
            spoken = self._agent_errors.pop(span.trace_id, None)
        for call, ref in calls:
            session = ref()
            if session is None or call.done or not call.stored:
                continue
            if isinstance(raised, Exception):
                call.raised = call.raised or error_text(raised)
            elif raised is None and span.error is None:
                call.final = True  # the Runner returned
            call.settle(spoken)
            post_records(session, call)

    def _timed(self, span: Span[Any]) -> None:
        """A model or tool call's span, timed, for the calls the hooks do not time."""
        with self._lock:
            calls = [call for call, _ in self._calls.get(span.trace_id, ()) if not call.hooked]
        if not calls:
            return
        timed = span_time(span)
        if timed is None:
            return
        data = span.span_data
        if isinstance(data, FunctionSpanData):
            kind, name = "tool", data.name
        elif isinstance(data, GenerationSpanData):
            kind, name = "model", data.model or "model call"
        else:
            model = getattr(data.response, "model", None)
            kind, name = "model", model if isinstance(model, str) else "model call"
        for call in calls:
            call.current.calls.append(CallTime(kind, name, *timed, failed=span.error is not None))
            call.changed.add(call.current.id)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


def span_time(span: Span[Any]) -> tuple[int, float] | None:
    """A span's start (epoch ms) and length (ms), from its ISO times."""
    try:
        start = datetime.fromisoformat(span.started_at or "")
        end = datetime.fromisoformat(span.ended_at or "")
    except ValueError:
        return None
    return int(start.timestamp() * 1000), (end - start).total_seconds() * 1000


def post_records(session: ZidaneSession, call: RunnerCall) -> None:
    """Write the records of ``call``, ended, from any thread (never raises, never waits)."""
    shared = session._shared
    if shared is None:
        return
    try:
        shared.portal.post(session._write_runs_soon, shared, records(call, None))
    except ActorClosed:
        return


_failures: Failures | None = None
_install = threading.Lock()


def failures() -> Failures:
    """The processor, added to the SDK's trace processors on first use.

    ``agents.set_trace_processors`` replaces the list: pass it along
    (``set_trace_processors([mine, failures()])``) to keep it.
    """
    global _failures
    with _install:
        if _failures is None:
            _failures = Failures()
            add_trace_processor(_failures)
        return _failures


def traced(session: ZidaneSession, call: RunnerCall) -> None:
    """Follow ``call`` through the SDK's tracing, when a trace holds it."""
    failures().traced(session, call)


def records(call: RunnerCall | None, runs: list[Placed] | None) -> list[SessionRun]:
    """The run records a write carries: its own runs first, then the others that changed."""
    if call is None:
        return []
    wanted: list[Run] = []
    for run in [*(run for run, _ in runs or ()), call.current]:
        if run not in wanted:
            wanted.append(run)
    wanted.extend(r for r in call.runs if r.id in call.changed and r not in wanted)
    call.changed.clear()
    tokens = None if call.hooked else call.tokens
    return [run.record(tokens if run is call.runs[0] else None) for run in wanted]
