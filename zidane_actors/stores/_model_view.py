"""The model's view of a stored session: the store's own read, else a whole load."""

from __future__ import annotations

from typing import cast

from ..model import SessionTurn, model_view
from ._protocol import FullSessionStore, SessionStore, store_capabilities

__all__ = ["read_model_view"]


async def read_model_view(
    store: SessionStore, session_id: str, caps: frozenset[str] | None = None
) -> list[SessionTurn] | None:
    """``model_view`` of the turns ``store`` holds for ``session_id``; ``None`` when it has none.

    Through the store's ``load_model_view`` (a read from the latest compaction
    on) when it has one (``caps``: its capabilities, when the caller knows
    them), else ``load`` and :func:`~zidane_actors.model.model_view`.
    """
    caps = store_capabilities(store) if caps is None else caps
    if "load_model_view" in caps:
        return await cast(FullSessionStore, store).load_model_view(session_id)
    data = await store.load(session_id)
    return None if data is None else list(model_view(data.turns))
