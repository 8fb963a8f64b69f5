"""Test-only fault injection: delayed and failed answers, for retry and timeout tests.

Enabled only through :func:`serve`'s ``faults`` argument, which the CLI
fills from the ``ZIDANE_ACTORS_FAULTS`` environment variable
(``delay_ms=800,delay_every=3,fail_every=4``). Faults hit requests after
the handler ran, so a failed or late answer may hide an applied write —
exactly what a client's retries must survive.
"""

from __future__ import annotations

import attrs
import trio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ValidationError
from ..model import preview
from ._errors import ApiError
from ._guard import HttpMiddleware

__all__ = ["FaultInjection", "parse_faults"]


@attrs.frozen
class FaultInjection:
    """Faults by request count: every ``delay_every``-th answer is ``delay_ms`` late,
    every ``fail_every``-th is replaced by a 500."""

    delay_ms: int = 0
    delay_every: int = 0
    fail_every: int = 0

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with these faults applied to its HTTP answers."""
        return _FaultyApp(app=app, faults=self)


def parse_faults(spec: str) -> FaultInjection:
    """Parse ``key=value,…`` (keys ``delay_ms``, ``delay_every``, ``fail_every``)."""
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or key not in ("delay_ms", "delay_every", "fail_every"):
            raise ValidationError(
                f"fault spec item {preview(item)} is not delay_ms|delay_every|fail_every=N"
            )
        if not raw.isdigit():
            raise ValidationError(
                f"fault spec {key} must be a non-negative integer, got {preview(raw)}"
            )
        values[key] = int(raw)
    return FaultInjection(**values)


@attrs.define(eq=False)
class _FaultyApp(HttpMiddleware):
    faults: FaultInjection
    _count: int = 0

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/openapi.json":  # the schema is never faulted
            await self.app(scope, receive, send)
            return
        self._count += 1
        n = self._count
        messages: list[Message] = []

        async def keep(message: Message) -> None:
            messages.append(message)

        await self.app(scope, receive, keep)
        f = self.faults
        if f.delay_every and n % f.delay_every == 0:
            await trio.sleep(f.delay_ms / 1000)
        if f.fail_every and n % f.fail_every == 0:
            await ApiError(500, "injected", "injected fault").response()(scope, receive, send)
            return
        for message in messages:
            await send(message)
