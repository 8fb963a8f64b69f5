"""Resource limits of the server: concurrent requests, body size, body time, body memory.

A slow or hostile client must not hold the server: every request counts
against ``max_requests`` (503 with ``Retry-After`` beyond it), a body must
arrive whole within ``body_timeout_s`` (408 otherwise), and the bytes of all
request bodies being read or served, of all answers being sent and of the
store reads that answers and the browser's pages hold stay within
``max_body_bytes_in_flight`` (503 with ``Retry-After`` when one would pass it).
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Hashable, Iterator
from typing import Any, Final

import attrs
import trio
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ValidationError
from ..model import preview
from ._errors import ApiError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "RETRY_AFTER_S",
    "Admission",
    "AnswerBudget",
    "BodyBudget",
    "CloseUnread",
    "ReadBudget",
    "ReadHold",
    "ServerLimits",
    "busy",
    "read_body",
]

DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
"""Largest request body accepted by default (a whole session document fits)."""

RETRY_AFTER_S: Final = 1
"""The ``Retry-After`` of a 503 answered because the server is at a limit."""


def _positive(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0
        or not math.isfinite(value)
    ):
        raise ValidationError(f"{attribute.name} must be a positive number, got {preview(value)}")


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, int):
        raise ValidationError(f"{attribute.name} must be an integer, got {preview(value)}")
    _positive(instance, attribute, value)


@attrs.frozen
class ServerLimits:
    """What one server process accepts at once; every value must be positive."""

    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=_positive_int)
    """Largest request body (413 beyond, declared or counted)."""
    max_body_bytes_in_flight: int = attrs.field(
        default=4 * DEFAULT_MAX_BODY_BYTES, validator=_positive_int
    )
    """Bytes of all request bodies held at once, from their reading until their handler answers."""
    max_requests: int = attrs.field(default=256, validator=_positive_int)
    """Requests served at once (503 with ``Retry-After`` beyond)."""
    body_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    """Time for a whole request body to arrive once its headers are in (408 beyond)."""
    read_timeout_s: float = attrs.field(default=60.0, validator=_positive)
    """Longest silence of a client mid-request (the connection is closed)."""
    keep_alive_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    """Time for a connection's request headers to arrive (from its opening or its last
    answer), and how long an idle kept-alive connection stays open."""
    max_header_bytes: int = attrs.field(default=16 * 1024, validator=_positive_int)
    """Largest request line plus headers (the connection is answered 400 and closed)."""

    def __attrs_post_init__(self) -> None:
        if self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ValidationError(
                f"max_body_bytes_in_flight ({self.max_body_bytes_in_flight}) must be at least "
                f"max_body_bytes ({self.max_body_bytes}), or no largest body could be read"
            )


def busy(message: str) -> ApiError:
    """The 503 answered when a limit is reached: the client may come back later."""
    return ApiError(503, "busy", message, headers={"retry-after": str(RETRY_AFTER_S)})


@attrs.define(eq=False)
class BodyBudget:
    """The bytes of request bodies held at once, reserved before they are read."""

    limit: int
    held: int = 0

    def reserve(self, size: int) -> None:
        """Take ``size`` bytes (503 ``busy`` when that would pass the limit)."""
        if self.held + size > self.limit:
            raise busy("the server holds too many request bodies at once; retry later")
        self.held += size

    def reserve_answer(self, size: int) -> None:
        """:meth:`reserve` for a built answer: one larger than the whole limit is still
        taken when nothing else is held (it could never go out otherwise)."""
        if size > self.limit and not self.held:
            self.held += size
        else:
            self.reserve(size)

    def take(self, size: int) -> None:
        """Count ``size`` bytes without the limit check (bytes already being sent)."""
        self.held += size

    def release(self, size: int) -> None:
        """Give back bytes taken by :meth:`reserve`, :meth:`reserve_answer` or :meth:`take`."""
        self.held -= size


@attrs.define(eq=False)
class ReadHold:
    """The bytes one :meth:`ReadBudget.hold` counts: reserved first, then what was read."""

    budget: BodyBudget
    held: int
    read: int = 0

    def add(self, size: int) -> None:
        """Count ``size`` bytes just read (past the reservation: taken without the check,
        they are in memory already)."""
        self.read += size
        extra = self.read - self.held
        if extra > 0:
            self.budget.take(extra)
            self.held += extra


@attrs.define(eq=False)
class ReadBudget:
    """Store reads of unknown size (a session, its history, a page of turns) in the body budget.

    What a read holds is known only once read, so each is counted at what
    its caller measured (``ReadHold.add``), from its reading until its
    answer or page is built. A read already measured (same key: the same
    route over the same session) first reserves that size, 503 ``busy``
    when it would pass the budget (one larger than the whole budget still
    goes when nothing else is held, as an answer does). A read never
    measured goes without a reservation, but single-flight: concurrent first
    reads of one key wait for the first to be measured, and at most
    ``unmeasured`` keys are read unmeasured at once. So many reads of a huge
    session hold at most the budget (or one read larger than it) plus
    ``unmeasured`` reads not yet measured, and the rest are answered 503;
    many small sessions read for the first time still go side by side.
    """

    budget: BodyBudget
    remembered: int = 1024
    """Sizes kept (the most recently used keys)."""
    unmeasured: int = 4
    """Reads of different keys never measured that may go at once."""
    _sizes: OrderedDict[Hashable, int] = attrs.field(factory=OrderedDict, init=False)
    _measuring: dict[Hashable, trio.Event] = attrs.field(factory=dict, init=False)
    _slots: trio.Semaphore = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self.unmeasured)

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[ReadHold]:
        """Count the reads made under ``key`` (``ReadHold.add`` each) until the block ends."""
        known = self._sizes.get(key)
        while known is None and key in self._measuring:  # its first read is under way
            await self._measuring[key].wait()
            known = self._sizes.get(key)  # none if that read failed: this one measures
        if known is None:
            measured = self._measuring[key] = trio.Event()
            try:
                async with self._slots:
                    with self._counted(key, 0) as held:
                        yield held
            finally:
                del self._measuring[key]
                measured.set()
            return
        self.budget.reserve_answer(known)
        with self._counted(key, known) as held:
            yield held

    @contextlib.contextmanager
    def _counted(self, key: Hashable, reserved: int) -> Iterator[ReadHold]:
        held = ReadHold(self.budget, reserved)
        try:
            yield held
        finally:
            self.budget.release(held.held)
        self._sizes[key] = held.read
        self._sizes.move_to_end(key)
        if len(self._sizes) > self.remembered:
            self._sizes.popitem(last=False)


async def read_body(request: Request, limits: ServerLimits, budget: BodyBudget) -> bytearray:
    """The whole body of ``request``, read under the size, time and memory limits.

    The bytes reserved stay counted in ``request.state.body_bytes`` until
    the caller releases them (when the answer is sent).
    """
    too_large = ApiError(
        413, "body_too_large", f"request body exceeds the limit of {limits.max_body_bytes} bytes"
    )
    declared = request.headers.get("content-length")
    reserved = 0
    if declared is not None and declared.isascii() and declared.isdigit():
        if int(declared) > limits.max_body_bytes:
            raise too_large
        reserved = int(declared)
        budget.reserve(reserved)
        request.state.body_bytes = reserved
    body = bytearray()
    receive = request.receive
    with trio.move_on_after(limits.body_timeout_s) as deadline:
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                raise ClientDisconnect
            chunk: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) + len(chunk) > limits.max_body_bytes:
                raise too_large
            extra = len(body) + len(chunk) - reserved
            if extra > 0:
                budget.reserve(extra)
                reserved += extra
                request.state.body_bytes = reserved
            body += chunk
    if deadline.cancelled_caught:
        raise ApiError(
            408,
            "body_timeout",
            f"the request body did not arrive within {limits.body_timeout_s:g} s",
            headers={"connection": "close"},
        )
    return body


@attrs.define(eq=False)
class Admission:
    """ASGI middleware: at most ``max_requests`` HTTP requests in the app at once."""

    app: ASGIApp
    max_requests: int
    active: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.active >= self.max_requests:
            refusal = busy(f"the server is serving {self.max_requests} requests; retry later")
            await refusal.response()(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


@attrs.define(eq=False)
class AnswerBudget:
    """ASGI middleware: an answer's bytes count against the body budget until sent.

    Request bodies and answers share one budget, so a few huge answers (a
    session of 50 MB turns read by many clients at once, or by slow ones)
    cannot pile up in memory: an answer whose first bytes would pass the
    budget is replaced by a 503 ``busy`` (its headers are held until then),
    and what is reserved is given back as soon as each chunk is sent or the
    client left. An answer larger than the whole budget goes out when it is
    alone (nothing else held), so no stored session becomes unreadable.
    """

    app: ASGIApp
    budget: BodyBudget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        refused = False

        async def budgeted_send(message: Message) -> None:
            nonlocal start, refused
            if refused:
                return  # the 503 went instead: drop the rest of the answer
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            size = len(message.get("body", b""))
            if start is not None:
                try:
                    self.budget.reserve_answer(size)
                except ApiError as exc:
                    refused = True
                    await exc.response()(scope, receive, send)
                    return
                first, start = start, None
                try:
                    await send(first)
                    await send(message)
                finally:
                    self.budget.release(size)
                return
            self.budget.take(size)  # a stream's later chunk: counted, never refused
            try:
                await send(message)
            finally:
                self.budget.release(size)

        await self.app(scope, receive, budgeted_send)
        if start is not None and not refused:  # an answer with no body message
            await send(start)


@attrs.define(eq=False)
class CloseUnread:
    """ASGI middleware: an answer sent before its request body was read closes the connection.

    A refusal (a guard rule, a limit, a bad id) answers without reading the
    body. The unread bytes still sit on the connection, so it cannot serve
    another request reliably; ``Connection: close`` tells the client not to
    reuse it rather than letting its next request race the server's close.
    """

    app: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        unread = headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers
        if not unread:
            await self.app(scope, receive, send)
            return

        async def tracked_receive() -> Message:
            nonlocal unread
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                unread = False
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                message = {
                    **message,
                    "headers": [
                        *(
                            (k, v)
                            for k, v in message.get("headers", ())
                            if k.lower() != b"connection"
                        ),
                        (b"connection", b"close"),
                    ],
                }
            await send(message)

        await self.app(scope, tracked_receive, closing_send)
