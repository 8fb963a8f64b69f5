"""The one exception hierarchy of zidane_actors.

Every error the library raises on purpose is a :class:`ZidaneActorsError`.
Bad input is a :class:`ValidationError` (also a :class:`ValueError`) whose
message says what was wrong and where (``path`` is a JSONPath-like locator
such as ``$.turns[3].content[0].type`` when one is known). A closed or
crashed actor is an :class:`ActorError` (also a :class:`RuntimeError`).
"""

from __future__ import annotations

__all__ = [
    "ActorClosed",
    "ActorCrashed",
    "ActorError",
    "ConflictError",
    "CorruptDataError",
    "CorruptDataWarning",
    "ExtensionStateError",
    "ExternalChangeWarning",
    "InvalidNameError",
    "MigrationWarning",
    "NoStoreError",
    "RemoteStoreError",
    "SessionNotFoundError",
    "StaleSessionError",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "StoreReadOnlyError",
    "StoreUnavailableError",
    "UnsupportedOperationError",
    "ValidationError",
    "WireFormatError",
    "WireTypeError",
    "ZidaneActorsError",
]


class ZidaneActorsError(Exception):
    """Base class of every error zidane_actors raises on purpose."""


class ValidationError(ZidaneActorsError, ValueError):
    """Untrusted input (JSON, wire message, HTTP body, name) is invalid.

    ``path`` locates the bad field when it is known (``$`` is the root).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{message} (at {path})" if path else message)


class WireFormatError(ValidationError):
    """A provider wire message (Anthropic, OpenAI) cannot be converted."""


class WireTypeError(WireFormatError, TypeError):
    """A wire message holds a value of a type JSON cannot carry (an object, bytes, a set…).

    Also a :class:`TypeError`, as ``json.dumps`` raises for such a value: code
    written against another session (openai-agents' ``SQLiteSession`` raises
    ``TypeError`` for an item it cannot serialize) catches it the same way.
    A key that is not a string is refused with it too.
    """


class InvalidNameError(ValidationError):
    """A session id, extension name, key or file name is unsafe or malformed."""


class ExtensionStateError(ValidationError):
    """Extension session state breaks a naming rule or a size limit."""


class StoreError(ZidaneActorsError):
    """A session store failed to carry out an operation."""


class SessionNotFoundError(StoreError, LookupError):
    """The store holds no session with the given id."""


class StoreClosedError(StoreError):
    """The store was closed; no further operation is accepted."""


class ConflictError(StoreError):
    """A conditional write lost a race (stale revision, claimed id, …)."""


class StaleSessionError(ConflictError):
    """A write computed from a session's memory lost to another writer.

    The store's ``rev`` of the session is no longer the one the write was
    computed from (``expected``; ``actual`` is the stored one, ``None`` when
    the session is gone). Nothing was written. A :class:`~zidane_actors.Session`
    that meets it refreshes its memory from the store first, so redoing the
    change works on fresh data.
    """

    def __init__(self, message: str, *, expected: int | None, actual: int | None) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class CorruptDataError(StoreError):
    """Persisted data (a database row, a file on disk) does not decode."""


class CorruptDataWarning(UserWarning):
    """Damaged persisted data was skipped (a line truncated by a crash mid-write)."""


class ExternalChangeWarning(UserWarning):
    """Stored files changed outside the store (another writer, an edit) and are read as they are.

    The message names the file and says what changed; nothing committed was lost.
    """


class StoreLockedError(StoreError):
    """Another store holds what this store must own alone (a file-map directory open elsewhere)."""


class StoreReadOnlyError(StoreError, PermissionError):
    """The store's storage is read-only for this process: it is read, never written.

    Also a :class:`PermissionError`, as the refused write would have raised.
    """


class MigrationWarning(UserWarning):
    """A schema migration changed stored data to satisfy a new rule (what it did is said)."""


class StoreUnavailableError(StoreError):
    """The backend cannot be reached (network, server down, timeout)."""


class RemoteStoreError(StoreError):
    """The remote session API answered with an error.

    ``status`` is the HTTP status and ``code`` the API's error code.
    """

    def __init__(self, message: str, *, status: int, code: str | None = None) -> None:
        self.status = status
        self.code = code
        super().__init__(f"{message} (HTTP {status}{', ' + code if code else ''})")


class UnsupportedOperationError(StoreError):
    """The store does not implement an optional method the caller needs."""


class NoStoreError(ZidaneActorsError):
    """A session without a store was asked to persist."""


class ActorError(ZidaneActorsError, RuntimeError):
    """Base class of actor runtime failures.

    Also a :class:`RuntimeError`, as Python's own "is closed" errors are: code
    written against another session (openai-agents' ``SQLiteSession`` raises
    ``RuntimeError`` once closed) catches a closed one the same way.
    """


class ActorClosed(ActorError):
    """The actor has stopped (closed or crashed) and accepts no commands."""


class ActorCrashed(ActorError):
    """The actor died while this command was pending; ``__cause__`` says why."""
