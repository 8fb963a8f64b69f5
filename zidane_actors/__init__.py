"""Durable, correct AI-agent sessions on trio.

Sessions are trio actors that apply every mutation in mailbox order; stores
(memory, SQLite, file map, remote REST, PostgreSQL) are pluggable. The names
below are the everyday surface; each layer's package exports the rest, in
layer order: ``zidane_actors.model`` (1), ``.wire`` (2), ``.stores`` (3),
``.actors`` (4), ``.server`` (5), the ``zidane-actors`` command ``cli.py``
with ``_transfer.py`` (6), then ``.portal`` and ``.integrations`` (7).
"""

from typing import TYPE_CHECKING, Any

from . import errors
from .actors import (
    RunStats,
    Session,
    SessionHost,
    create_session,
    current_extension_session,
    delete_extension_session_state,
    get_extension_session_state,
    load_session,
    open_session_host,
    set_extension_session_state,
    with_extension_session,
)
from .model import (
    ARTIFACT_KINDS,
    ARTIFACT_META_MAX_BYTES,
    ARTIFACTS_METADATA_KEY,
    ARTIFACTS_PER_SESSION_CAP,
    SEND_REQUEST_HISTORY,
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionArtifact,
    SessionContentBlock,
    SessionData,
    SessionMessage,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    demote_stale_running_status,
    merge_session_metadata,
    resume_chain_run_ids,
)
from .stores import (
    SessionStore,
    create_file_map_store,
    create_memory_store,
    open_memory_store,
    open_sqlite_store,
)
from .wire import (
    auto_detect_and_convert,
    drop_invalid_tool_pairings,
    from_anthropic,
    from_openai,
    to_anthropic,
    to_openai,
    to_wire_messages,
)

if TYPE_CHECKING:
    from .stores import create_remote_store, open_postgres_store

__version__ = "0.1.0"

__all__ = [
    "ARTIFACTS_METADATA_KEY",
    "ARTIFACTS_PER_SESSION_CAP",
    "ARTIFACT_KINDS",
    "ARTIFACT_META_MAX_BYTES",
    "SEND_REQUEST_HISTORY",
    "FileBlock",
    "ImageBlock",
    "NativeBlock",
    "ReasoningBlock",
    "RunStats",
    "Session",
    "SessionArtifact",
    "SessionContentBlock",
    "SessionData",
    "SessionHost",
    "SessionMessage",
    "SessionRun",
    "SessionStore",
    "SessionTurn",
    "TextBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "__version__",
    "auto_detect_and_convert",
    "create_file_map_store",
    "create_memory_store",
    "create_remote_store",
    "create_session",
    "current_extension_session",
    "delete_extension_session_state",
    "demote_stale_running_status",
    "drop_invalid_tool_pairings",
    "errors",
    "from_anthropic",
    "from_openai",
    "get_extension_session_state",
    "load_session",
    "merge_session_metadata",
    "open_memory_store",
    "open_postgres_store",
    "open_session_host",
    "open_sqlite_store",
    "resume_chain_run_ids",
    "set_extension_session_state",
    "to_anthropic",
    "to_openai",
    "to_wire_messages",
    "with_extension_session",
]


def __getattr__(name: str) -> Any:
    # The PostgreSQL and remote stores load their drivers on first use (see .stores).
    if name in ("create_remote_store", "open_postgres_store"):
        from . import stores

        return getattr(stores, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
