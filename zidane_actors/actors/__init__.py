"""Layer 4: the actor runtime — sessions as trio actors, the store actor, the host."""

from ._actor import Actor, ActorState, ActorStatistics, Command, Reply, open_actor
from ._build import create_session, load_session
from ._commands import RunStats
from ._extension import (
    EXTENSION_KEY_PATTERN,
    EXTENSION_NAME_PATTERN,
    EXTENSION_STATE_ITEM_MAX_BYTES,
    EXTENSION_STATE_METADATA_KEY,
    EXTENSION_STATE_TOTAL_MAX_BYTES,
    bind_extension_session,
    current_extension_session,
    delete_extension_session_state,
    get_extension_session_state,
    set_extension_session_state,
    with_extension_session,
)
from ._host import HostStatistics, SessionHost, open_session_host
from ._repairs import close_interrupted_tool_calls
from ._session import MetaListener, SavedListener, Session
from ._store_actor import StoreActor, StoreActorStatistics, open_store_actor
from ._view import Clock

__all__ = [
    "EXTENSION_KEY_PATTERN",
    "EXTENSION_NAME_PATTERN",
    "EXTENSION_STATE_ITEM_MAX_BYTES",
    "EXTENSION_STATE_METADATA_KEY",
    "EXTENSION_STATE_TOTAL_MAX_BYTES",
    "Actor",
    "ActorState",
    "ActorStatistics",
    "Clock",
    "Command",
    "HostStatistics",
    "MetaListener",
    "Reply",
    "RunStats",
    "SavedListener",
    "Session",
    "SessionHost",
    "StoreActor",
    "StoreActorStatistics",
    "bind_extension_session",
    "close_interrupted_tool_calls",
    "create_session",
    "current_extension_session",
    "delete_extension_session_state",
    "get_extension_session_state",
    "load_session",
    "open_actor",
    "open_session_host",
    "open_store_actor",
    "set_extension_session_state",
    "with_extension_session",
]
