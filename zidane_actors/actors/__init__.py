"""Layer 3: the actor runtime — sessions as trio actors, the store actor, the host."""

from ._actor import Actor, ActorState, ActorStatistics, Command, Reply, open_actor
from ._store_actor import StoreActor, StoreActorStatistics, open_store_actor

__all__ = [
    "Actor",
    "ActorState",
    "ActorStatistics",
    "Command",
    "Reply",
    "StoreActor",
    "StoreActorStatistics",
    "open_actor",
    "open_store_actor",
]
