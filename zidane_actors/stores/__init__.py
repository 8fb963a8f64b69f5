"""Layer 4: the ``SessionStore`` protocol and the bundled stores."""

from ._protocol import (
    OPTIONAL_METHODS,
    WRITE_METHODS,
    BatchingStore,
    FullSessionStore,
    HistoryMutation,
    MutateResult,
    RunClaim,
    SessionStore,
    StoreWrite,
    TurnsMutation,
    store_capabilities,
)

__all__ = [
    "OPTIONAL_METHODS",
    "WRITE_METHODS",
    "BatchingStore",
    "FullSessionStore",
    "HistoryMutation",
    "MutateResult",
    "RunClaim",
    "SessionStore",
    "StoreWrite",
    "TurnsMutation",
    "store_capabilities",
]
