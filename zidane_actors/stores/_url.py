"""Store URLs: the one parser the CLI and the portal share."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Final

from ..errors import ValidationError
from ..model import preview
from ._protocol import SessionStore

__all__ = ["STORE_URL_FORMS", "TOKEN_ENV", "open_store_url"]

TOKEN_ENV: Final = "ZIDANE_ACTORS_TOKEN"
STORE_URL_FORMS: Final = "sqlite:PATH, memory:, postgres://…, file:DIR or http(s)://…"


@asynccontextmanager
async def open_store_url(url: str) -> AsyncIterator[SessionStore]:
    """Open the store a URL names: ``sqlite:PATH``, ``memory:``, ``postgres://…``,
    ``file:DIR`` (a single-session file map) or ``http(s)://…`` (a remote session
    API; ``ZIDANE_ACTORS_TOKEN`` is sent as its bearer token)."""
    async with AsyncExitStack() as stack:
        yield await _enter_store(url, stack)


async def _enter_store(url: str, stack: AsyncExitStack) -> SessionStore:
    from . import (
        create_file_map_store,
        open_directory_adapter,
        open_memory_store,
        open_sqlite_store,
    )

    if url in ("memory", "memory:"):
        return await stack.enter_async_context(open_memory_store())
    if url.startswith("sqlite:") or url.endswith((".db", ".sqlite", ".sqlite3")):
        path = url.removeprefix("sqlite:")
        if not path:
            raise ValidationError("sqlite store URL needs a path: sqlite:PATH")
        return await stack.enter_async_context(open_sqlite_store(path))
    if url.startswith(("postgres://", "postgresql://", "postgres:")):
        from .postgres import open_postgres_store  # its driver loads only when used

        dsn = url if "://" in url else url.removeprefix("postgres:")
        return await stack.enter_async_context(open_postgres_store(dsn))
    if url.startswith("file:"):
        directory = url.removeprefix("file:")
        if not directory:
            raise ValidationError("file store URL needs a directory: file:DIR")
        adapter = await stack.enter_async_context(open_directory_adapter(directory))
        file_map = create_file_map_store(adapter)
        stack.push_async_callback(file_map.aclose)
        return file_map
    if url.startswith(("http://", "https://")):
        from .remote import create_remote_store  # its driver loads only when used

        token = os.environ.get(TOKEN_ENV)
        headers = {"authorization": f"Bearer {token}"} if token else None
        return await stack.enter_async_context(create_remote_store(url, headers=headers))
    raise ValidationError(f"unknown store URL {preview(url)}: use {STORE_URL_FORMS}")
