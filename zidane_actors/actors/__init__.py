"""Layer 4: the actor runtime — sessions as trio actors, the store actor, the host.

A session's branches and restores (``_branches``) and the retry of a
conditional write that lost a race (``_contention``) sit beside its handle.
"""

from . import _extension
from ._actor import Actor, ActorState, ActorStatistics, Command, Reply, open_actor
from ._build import create_session, load_session
from ._commands import RunStats
from ._extension import *  # noqa: F403 (extension state: every name of _extension.__all__)
from ._host import HostStatistics, SessionHost, open_session_host
from ._repairs import close_interrupted_tool_calls
from ._session import MetaListener, SavedListener, Session
from ._store_actor import StoreActor, StoreActorStatistics, open_store_actor
from ._view import Clock

__all__ = [
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
    "close_interrupted_tool_calls",
    "create_session",
    "load_session",
    "open_actor",
    "open_session_host",
    "open_store_actor",
]
__all__ += _extension.__all__
