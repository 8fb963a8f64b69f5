"""Serving the session API with hypercorn's trio worker."""

from __future__ import annotations

from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import Framework

from ..actors import open_store_actor
from ..errors import ValidationError
from ..model import preview
from ..stores import SessionStore
from ._app import create_app
from ._faults import FaultInjection
from ._guard import is_loopback_host
from ._limits import ServerLimits

__all__ = ["serve"]


async def serve(
    store: SessionStore,
    host: str = "127.0.0.1",
    port: int = 8787,
    *,
    token: str | None = None,
    limits: ServerLimits | None = None,
    faults: FaultInjection | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``store`` on ``host:port`` until cancelled (``port=0`` picks a free one).

    Without ``token`` only a loopback ``host`` is accepted (``ValidationError``
    otherwise): a server reachable from other machines must check a token.
    Plain writes go through a store actor, so concurrent ones share group
    commits when the store is a ``BatchingStore``. Under
    ``nursery.start`` the listening URL (``http://host:port``) is the start
    value. ``faults`` is for tests only (see :class:`FaultInjection`).
    """
    if token is None and not is_loopback_host(host.removeprefix("[").removesuffix("]")):
        raise ValidationError(
            f"refusing to serve on {preview(host)} without a token: anyone who can reach it could "
            "read and write every session; bind a loopback address (127.0.0.1) or set a token"
        )
    limits = limits or ServerLimits()
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    config.read_timeout = max(1, round(limits.read_timeout_s))
    config.keep_alive_timeout = limits.keep_alive_timeout_s
    config.h11_max_incomplete_size = limits.max_header_bytes
    config.h2_max_header_list_size = limits.max_header_bytes

    async with open_store_actor(store) as actor:
        app = create_app(store, token=token, limits=limits, writer=actor)
        if faults is not None:
            app = faults.wrap(app)

        async def run(
            *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
        ) -> None:
            await hypercorn_serve(cast("Framework", app), config, task_status=task_status)

        async with trio.open_nursery() as nursery:
            urls: list[str] = await nursery.start(run)
            task_status.started(urls[0])
