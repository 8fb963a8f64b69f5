"""Serving the session API with hypercorn's trio worker."""

from __future__ import annotations

from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import Framework

from ..stores import SessionStore
from ._app import DEFAULT_MAX_BODY_BYTES, create_app
from ._faults import FaultInjection

__all__ = ["serve"]


async def serve(
    store: SessionStore,
    host: str = "127.0.0.1",
    port: int = 8787,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    faults: FaultInjection | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``store`` on ``host:port`` until cancelled (``port=0`` picks a free one).

    Under ``nursery.start`` the listening URL (``http://host:port``) is the
    start value. ``faults`` is for tests only (see :class:`FaultInjection`).
    """
    app = create_app(store, token=token, max_body_bytes=max_body_bytes)
    if faults is not None:
        app = faults.wrap(app)
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await hypercorn_serve(cast("Framework", app), config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(run)
        task_status.started(urls[0])
